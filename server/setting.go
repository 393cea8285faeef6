package server

import (
	"encoding/json"
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"

	"github.com/conductor-go/conductor/internal/jsonval"
)

// setting is one key of a JSON configuration object (the file's root, or the cluster
// object), with everything about it in one place: its type, default, bounds and
// documentation, how its default is set and how a value is checked and stored into T.
// docs/configuration.md is generated from the tables of settings (configdoc.go).
type setting[T any] struct {
	key string
	// typ, def and bounds as the documentation shows them.
	typ, def, bounds string
	doc              string
	// init stores the default into the target (nil: the zero value is the default).
	init func(t *T)
	// parse checks a raw value and stores it; its error names the key.
	parse func(t *T, raw json.RawMessage) error
}

func (s *setting[T]) setDefault(t *T) {
	if s.init != nil {
		s.init(t)
	}
}

func (s *setting[T]) apply(t *T, raw json.RawMessage) error { return s.parse(t, raw) }

// shown replaces the documented default (for a default that is a rule rather than a
// value, such as "0 (no bound)").
func (s setting[T]) shown(def string) setting[T] {
	s.def = def
	return s
}

// also returns the setting with check run after each value is stored (a rule that
// needs more than the value's own bounds, such as the memory a size will take).
func (s setting[T]) also(check func(t *T) error) setting[T] {
	parse := s.parse
	s.parse = func(t *T, raw json.RawMessage) error {
		if err := parse(t, raw); err != nil {
			return err
		}
		return check(t)
	}
	return s
}

// intSetting is an integer key in min..max (max math.MaxInt64: no upper bound).
func intSetting[T any](key string, def, min, max int64, doc string, set func(*T, int64)) setting[T] {
	bounds := intBounds(min, max)
	return setting[T]{key: key, typ: "integer", def: intDefault(key, def), bounds: bounds, doc: doc,
		init: func(t *T) { set(t, def) },
		parse: func(t *T, raw json.RawMessage) error {
			v, err := jsonval.Int(raw)
			if err != nil || v < min || v > max {
				return fmt.Errorf("%s must be an integer in %s", key, bounds)
			}
			set(t, v)
			return nil
		}}
}

// stringSetting is a string key; check, when set, says why a value is refused ("" when
// it is not).
func stringSetting[T any](key, def, bounds, doc string, check func(string) string, set func(*T, string)) setting[T] {
	return setting[T]{key: key, typ: "string", def: "`" + strconv.Quote(def) + "`", bounds: bounds, doc: doc,
		init: func(t *T) { set(t, def) },
		parse: func(t *T, raw json.RawMessage) error {
			v, ok := jsonval.String(raw)
			if !ok {
				return fmt.Errorf("%s must be a string", key)
			}
			if check != nil {
				if why := check(v); why != "" {
					return fmt.Errorf("%s %s", key, why)
				}
			}
			set(t, v)
			return nil
		}}
}

// boolSetting is a true/false key.
func boolSetting[T any](key string, def bool, doc string, set func(*T, bool)) setting[T] {
	return setting[T]{key: key, typ: "boolean", def: strconv.FormatBool(def), bounds: "true, false", doc: doc,
		init: func(t *T) { set(t, def) },
		parse: func(t *T, raw json.RawMessage) error {
			switch strings.TrimSpace(string(raw)) {
			case "true":
				set(t, true)
			case "false":
				set(t, false)
			default:
				return fmt.Errorf("%s must be true or false", key)
			}
			return nil
		}}
}

// objectSetting is a key whose value parse reads whole (a nested object or list).
func objectSetting[T any](key, typ, def, bounds, doc string, parse func(*T, json.RawMessage) error) setting[T] {
	return setting[T]{key: key, typ: typ, def: def, bounds: bounds, doc: doc, parse: parse}
}

// intBounds shows min..max, with large powers of two as 2^n, and no upper bound as ">= min".
func intBounds(min, max int64) string {
	if max == math.MaxInt64 {
		return ">= " + strconv.FormatInt(min, 10)
	}
	return strconv.FormatInt(min, 10) + ".." + powerOfTwo(max)
}

func powerOfTwo(v int64) string {
	if v >= 1<<20 && bits.OnesCount64(uint64(v)) == 1 {
		return "2^" + strconv.Itoa(bits.TrailingZeros64(uint64(v)))
	}
	return strconv.FormatInt(v, 10)
}

// intDefault shows a default, with its size in KiB, MiB or GiB for byte counts.
func intDefault(key string, v int64) string {
	s := strconv.FormatInt(v, 10)
	if !strings.Contains(key, "bytes") && !strings.HasSuffix(key, "_size") || v < 1<<10 {
		return s
	}
	for _, u := range []struct {
		unit string
		n    int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if v%u.n == 0 {
			return s + " (" + strconv.FormatInt(v/u.n, 10) + " " + u.unit + ")"
		}
	}
	return s
}
