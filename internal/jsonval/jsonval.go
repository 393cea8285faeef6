// Package jsonval reads single JSON values strictly: an integer that is an integer (not a
// quoted number, not a fraction) and a string that is a string (not null). The config
// file, the state file and the cluster registry's records are read with it, so that a
// mistyped value is an error rather than a silent default.
package jsonval

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// Int accepts a JSON integer that fits int64 (no fraction, no exponent). A quoted number
// is a string, not an integer: json.Number alone would accept "16".
func Int(raw json.RawMessage) (int64, error) {
	var n json.Number
	if len(raw) == 0 || raw[0] == '"' || json.Unmarshal(raw, &n) != nil || n == "" {
		return 0, errors.New("must be an integer")
	}
	v, err := n.Int64()
	if err != nil {
		return 0, errors.New("must be an integer in int64 range")
	}
	return v, nil
}

// String decodes a JSON string. Null is not a string: json.Unmarshal would accept it into
// a string without error and leave "", turning an invalid value into a default.
func String(raw json.RawMessage) (string, bool) {
	var s string
	if len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

// CheckDuplicateKeys reports the first object key that appears twice in the same object
// anywhere in the JSON document data (encoding/json keeps the last one silently, so a
// file with "admin_token" twice would run with whichever came last). The error names the
// key and where it is, as a dotted path from the root ("cluster.key_prefix"). A document
// that does not parse is left to the caller's decoder (nil here).
func CheckDuplicateKeys(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	_, err := walkValue(dec, "")
	return err
}

// walkValue reads one value; it returns (false, nil) when the document ends or does not
// parse, which the caller's own decoding reports.
func walkValue(dec *json.Decoder, path string) (bool, error) {
	tok, err := dec.Token()
	if err != nil {
		return false, nil
	}
	switch tok {
	case json.Delim('{'):
		seen := map[string]bool{}
		for dec.More() {
			kt, err := dec.Token()
			if err != nil {
				return false, nil
			}
			key, _ := kt.(string)
			sub := key
			if path != "" {
				sub = path + "." + key
			}
			if seen[key] {
				where := "the root object"
				if path != "" {
					where = strconv.Quote(path)
				}
				return false, fmt.Errorf("duplicate key %q in %s", key, where)
			}
			seen[key] = true
			if ok, err := walkValue(dec, sub); !ok || err != nil {
				return ok, err
			}
		}
		_, err := dec.Token() // '}'
		return err == nil, nil
	case json.Delim('['):
		for i := 0; dec.More(); i++ {
			if ok, err := walkValue(dec, path+"["+strconv.Itoa(i)+"]"); !ok || err != nil {
				return ok, err
			}
		}
		_, err := dec.Token() // ']'
		return err == nil, nil
	}
	return true, nil
}
