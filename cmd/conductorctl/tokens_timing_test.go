package main

import (
	"strconv"
	"strings"
	"testing"
)

// A 32K-token prompt, the size an operator might paste from a long-context request.
func benchPrompt(json bool) []byte {
	var sb strings.Builder
	if json {
		sb.WriteByte('[')
	}
	for i := range 32768 {
		if i > 0 {
			sb.WriteString(", ")
		}
		sb.WriteString(strconv.Itoa(i * 7919 % 152064))
	}
	if json {
		sb.WriteByte(']')
	}
	return []byte(sb.String())
}

func BenchmarkParseTokens(b *testing.B) {
	for _, json := range []bool{false, true} {
		name := "text"
		if json {
			name = "json"
		}
		b.Run(name+"/tokens=32768", func(b *testing.B) {
			data := benchPrompt(json)
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := parseTokens(data); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
