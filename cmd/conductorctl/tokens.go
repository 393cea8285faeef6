package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
)

// tokenFlags are the ways to give a prompt's token ids: inline, from a file, or from
// stdin ("-" as the file, as the --tokens value, or as the only argument).
type tokenFlags struct {
	inline string
	file   string
}

func (t *tokenFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&t.inline, "tokens", "", "token ids, comma or space separated (\"-\" reads stdin)")
	fs.StringVar(&t.file, "tokens-file", "", "file of token ids: a JSON array, or ints separated by whitespace or commas (\"-\" reads stdin)")
}

// given reports whether any token source was named; rest are the positional arguments.
func (t *tokenFlags) given(rest []string) bool {
	return t.inline != "" || t.file != "" || len(rest) > 0
}

// read returns the token ids from the one source named. errUsage-wrapped errors are flag
// problems; others are bad input.
func (t *tokenFlags) read(stdin io.Reader, rest []string) ([]int32, error) {
	sources := 0
	for _, s := range []string{t.inline, t.file} {
		if s != "" {
			sources++
		}
	}
	switch {
	case len(rest) > 1 || (len(rest) == 1 && rest[0] != "-"):
		return nil, usageErr("unexpected arguments %q (only \"-\", for stdin, is accepted)", rest)
	case len(rest) == 1:
		sources++
	}
	if sources == 0 {
		return nil, usageErr("no tokens: give --tokens, --tokens-file or - (stdin)")
	}
	if sources > 1 {
		return nil, usageErr("give only one of --tokens, --tokens-file and - (stdin)")
	}
	var (
		data []byte
		err  error
		what string
	)
	switch {
	case t.file == "-" || t.inline == "-" || len(rest) == 1:
		what = "stdin"
		data, err = io.ReadAll(stdin)
	case t.file != "":
		what = t.file
		data, err = os.ReadFile(t.file)
	default:
		what = "--tokens"
		data = []byte(t.inline)
	}
	if err != nil {
		return nil, fmt.Errorf("read tokens from %s: %w", what, err)
	}
	toks, err := parseTokens(data)
	if err != nil {
		return nil, fmt.Errorf("tokens from %s: %w", what, err)
	}
	return toks, nil
}

// parseTokens reads a JSON array of integers, or integers separated by whitespace and/or
// commas. Ids must fit in int32, the range the contract accepts.
func parseTokens(data []byte) ([]int32, error) {
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) > 0 && trimmed[0] == '[' {
		return parseJSONTokens(trimmed)
	}
	toks := make([]int32, 0, len(data)/4)
	i := 0
	for f := range bytes.FieldsFuncSeq(data, isTokenSep) {
		v, err := parseToken(f)
		if err != nil {
			return nil, fmt.Errorf("token %d (%q): %w", i, f, err)
		}
		toks = append(toks, v)
		i++
	}
	return toks, nil
}

func isTokenSep(r rune) bool {
	return r == ',' || r == ' ' || r == '\t' || r == '\n' || r == '\r'
}

// parseJSONTokens parses a JSON array of integers by hand: the grammar is small (ints,
// commas, JSON whitespace), and this is several times faster than encoding/json for the
// long prompts the CLI is fed. data starts with '['.
func parseJSONTokens(data []byte) ([]int32, error) {
	end := bytes.IndexByte(data, ']')
	if end < 0 {
		return nil, errors.New("JSON array of ints: missing ]")
	}
	if rest := bytes.TrimSpace(data[end+1:]); len(rest) != 0 {
		return nil, errors.New("JSON array of ints: trailing data after the array")
	}
	body := data[1:end]
	if len(bytes.TrimSpace(body)) == 0 {
		return []int32{}, nil
	}
	toks := make([]int32, 0, bytes.Count(body, []byte{','})+1)
	for i := 0; len(body) > 0 || i == 0; i++ {
		elem := body
		if c := bytes.IndexByte(body, ','); c >= 0 {
			elem, body = body[:c], body[c+1:]
			if len(bytes.TrimSpace(body)) == 0 {
				return nil, fmt.Errorf("JSON array of ints: trailing comma after token %d", i)
			}
		} else {
			body = nil
		}
		elem = bytes.TrimSpace(elem)
		if len(elem) == 0 {
			return nil, fmt.Errorf("JSON array of ints: empty element %d", i)
		}
		v, err := parseToken(elem)
		if err != nil {
			return nil, fmt.Errorf("token %d (%s): %w", i, elem, err)
		}
		toks = append(toks, v)
	}
	return toks, nil
}

func parseToken(f []byte) (int32, error) {
	v, err := strconv.ParseInt(string(f), 10, 64)
	if err != nil {
		var ne *strconv.NumError
		if errors.As(err, &ne) && errors.Is(ne.Err, strconv.ErrRange) {
			return 0, errors.New("out of int32 range")
		}
		return 0, errors.New("not an integer")
	}
	if v < math.MinInt32 || v > math.MaxInt32 {
		return 0, errors.New("out of int32 range")
	}
	return int32(v), nil
}

// usageError marks an error that should print the command's usage.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usageErr(format string, args ...any) error {
	return &usageError{fmt.Sprintf(format, args...)}
}
