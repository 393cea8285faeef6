// Package jsonval reads single JSON values strictly: an integer that is an integer (not a
// quoted number, not a fraction) and a string that is a string (not null). The config
// file, the state file and the cluster registry's records are read with it, so that a
// mistyped value is an error rather than a silent default.
package jsonval

import (
	"encoding/json"
	"errors"
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
