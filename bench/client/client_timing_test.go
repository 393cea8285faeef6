package client

import "testing"

// BenchmarkAppendQuery measures encoding an 8K-token /query body.
func BenchmarkAppendQuery(b *testing.B) {
	for _, bin := range []bool{false, true} {
		name := "array"
		if bin {
			name = "binary"
		}
		b.Run(name, func(b *testing.B) {
			toks := make([]int32, 8192)
			for i := range toks {
				toks[i] = int32(i * 37 % 100000)
			}
			q := &Query{Model: "m", BlockSize: 16, Tokens: toks, BinaryTokens: bin}
			buf := AppendQuery(nil, q)
			b.ReportAllocs()
			b.SetBytes(int64(len(buf)))
			for b.Loop() {
				buf = AppendQuery(buf[:0], q)
			}
		})
	}
}

// BenchmarkResultDecode measures decoding a two-instance, two-rank /query answer.
func BenchmarkResultDecode(b *testing.B) {
	body := queryAnswer()
	var res Result
	res.SetInstances([]string{"a", "zz"})
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if err := res.Decode(body); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkQueryRoundTrip measures one /query against an in-process fake conductor.
func BenchmarkQueryRoundTrip(b *testing.B) {
	f := startFake(b)
	c := New(f.addr, 0)
	defer c.Close()
	var res Result
	res.SetInstances([]string{"a", "zz"})
	q := &Query{Model: "m", BlockSize: 16, Tokens: make([]int32, 2048)}
	b.ReportAllocs()
	for b.Loop() {
		if err := c.Query(q, &res); err != nil {
			b.Fatal(err)
		}
	}
}
