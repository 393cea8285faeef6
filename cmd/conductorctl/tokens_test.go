package main

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseTokens(t *testing.T) {
	good := map[string][]int32{
		"":                           {},
		"  \n":                       {},
		"[]":                         {},
		"1":                          {1},
		"1,2,3":                      {1, 2, 3},
		"1, 2 ,3\r\n4\t5,,6\n":       {1, 2, 3, 4, 5, 6},
		"-2147483648 2147483647":     {-2147483648, 2147483647},
		" [ -1, 0 , 2147483647 ] \n": {-1, 0, 2147483647},
	}
	for in, want := range good {
		got, err := parseTokens([]byte(in))
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("%q: got %v %v, want %v", in, got, err, want)
		}
	}
	bad := map[string]string{
		"1 2 x":                `token 2 ("x"): not an integer`,
		"2147483648":           "out of int32 range",
		"-2147483649":          "out of int32 range",
		"99999999999999999999": "out of int32 range",
		"1.5":                  "not an integer",
		"[1, \"2\"]":           `token 1 ("2"): not an integer`,
		"[1, 2] [3]":           "trailing data",
		"[1, 2":                "JSON array of ints",
		"[1e3]":                "not an integer",
		"[4294967296]":         "out of int32 range",
	}
	for in, want := range bad {
		if _, err := parseTokens([]byte(in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want %q", in, err, want)
		}
	}
}

func TestParseJSONTokensGrammar(t *testing.T) {
	for _, in := range []string{"[1,,2]", "[1,]", "[,1]", "[1 2]", "[1]]", "[[1]]", "[01x]"} {
		if toks, err := parseTokens([]byte(in)); err == nil {
			t.Errorf("%q accepted as %v", in, toks)
		}
	}
	if toks, err := parseTokens([]byte("[\n  7,\r\n\t-8 ]")); err != nil || !reflect.DeepEqual(toks, []int32{7, -8}) {
		t.Errorf("multi-line array: %v %v", toks, err)
	}
}
