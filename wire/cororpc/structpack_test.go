package cororpc

import (
	"crypto/md5"
	"encoding/binary"
	"errors"
	"testing"
)

// struct_pack derives a type code from a "type literal": one byte per type id, in
// declaration order, structs bracketed by 253 ... 255, templates followed by their
// arguments. The code is the first 4 MD5 bytes read big-endian with bit 0 cleared.
// Rebuilding the literals here checks that the hard-coded codes are the conductor types
// with the field types and order of reference-notes §2.2, and derives the two framework
// error body codes that no golden shows.
const (
	tidInt32    = 1
	tidInt64    = 3
	tidUint64   = 4
	tidUint16   = 8
	tidBool     = 11
	tidChar     = 12
	tidString   = 128
	tidMap      = 130
	tidSet      = 131
	tidVector   = 132
	tidOptional = 133
	tidExpected = 135
	tidStruct   = 253
	tidEnd      = 255
)

func spLitStruct(fields ...[]byte) []byte {
	out := []byte{tidStruct}
	for _, f := range fields {
		out = append(out, f...)
	}
	return append(out, tidEnd)
}

// spLitTrivialStruct is a struct of fundamentals, which struct_pack memcpys: its literal
// carries the packing and alignment (8 -> 8+129) before the end mark.
func spLitTrivialStruct(align byte, fields ...[]byte) []byte {
	out := spLitStruct(fields...)
	return append(out[:len(out)-1], align+129, align+129, tidEnd)
}

func spLit(ids ...byte) []byte { return ids }

func spLitOf(id byte, args ...[]byte) []byte {
	out := []byte{id}
	for _, a := range args {
		out = append(out, a...)
	}
	return out
}

func spTypeCode(literal []byte) uint32 {
	sum := md5.Sum(literal)
	return binary.BigEndian.Uint32(sum[:4]) &^ 1
}

func TestStructPackTypeCodesFromStructure(t *testing.T) {
	str := spLit(tidString, tidChar)
	i32, i64, u64 := spLit(tidInt32), spLit(tidInt64), spLit(tidUint64)
	errorCode := i32 // enum ErrorCode : int32
	contextKey := spLitStruct(str, str, str, i64)
	profile := spLitStruct(str, str, str, str, str)
	serviceConfig := spLitStruct(str, str, i32 /* PublisherKind */, str, str, str, str, i64, i32,
		spLitOf(tidOptional, i64), profile)
	rankHit := spLitTrivialStruct(8, i64, i64, i64, i64)
	cacheHit := spLitStruct(i64, spLitOf(tidMap, i64, i64), spLitOf(tidMap, i64, rankHit), i64, i64, i64, i64)
	contextView := spLitStruct(contextKey, profile, spLitOf(tidMap, str, spLitOf(tidSet, i64)), u64)
	profileExt := spLitStruct(str, str, i64)

	for _, c := range []struct {
		name    string
		literal []byte
		code    uint32
	}{
		{"QueryRequest", spLitStruct(contextKey, spLitOf(tidVector, i32), spLitOf(tidOptional, str), spLitOf(tidOptional, str)), codeQueryRequest},
		{"expected<QueryResult>", spLitOf(tidExpected, spLitStruct(spLitOf(tidMap, str, cacheHit)), errorCode), codeQueryResponse},
		{"ServiceConfig", serviceConfig, codeServiceConfig},
		{"expected<RegisterResult>", spLitOf(tidExpected, spLitStruct(str, spLit(tidBool)), errorCode), codeRegisterResponse},
		{"tuple<string,string,int>", spLitStruct(str, str, i32), codeUnregisterArgs},
		{"expected<UnregisterResult>", spLitOf(tidExpected, spLitStruct(str), errorCode), codeUnregisterResp},
		{"GlobalView", spLitStruct(i32, spLitOf(tidVector, contextView)), codeGlobalView},
		{"vector<ServiceConfig>", spLitOf(tidVector, serviceConfig), codeServiceList},
		{"string", str, codeString},
		{"pair<uint16,string>", spLitStruct(spLit(tidUint16), str), codeU16StringPair},
		// This conductor's methods (ext.go).
		{"RegisterExArgs", spLitStruct(serviceConfig, profileExt, spLitOf(tidOptional, spLitOf(tidVector, str))), codeRegisterExArgs},
		{"tuple<string,string,int,string>", spLitStruct(str, str, i32, str), codeUnregisterAdapterArgs},
		{"vector<ServiceDetail>", spLitOf(tidVector, spLitStruct(serviceConfig, profileExt, spLitOf(tidVector, str), str)), codeServiceDetails},
	} {
		if got := spTypeCode(c.literal); got != c.code {
			t.Errorf("%s: computed %#08x, constant %#08x", c.name, got, c.code)
		}
	}
}

func TestStructPackWidthRule(t *testing.T) {
	for _, c := range []struct {
		max   uint64
		width int
		meta  byte
	}{
		{0, 1, 0}, {255, 1, 0}, {256, 2, 0x08}, {65535, 2, 0x08}, {65536, 4, 0x10},
		{1<<32 - 1, 4, 0x10}, {1 << 32, 8, 0x18},
	} {
		w, m := widthFor(c.max)
		if w != c.width || m != c.meta {
			t.Errorf("max %d: width %d meta %#x, want %d %#x", c.max, w, m, c.width, c.meta)
		}
		b, w2 := begin(nil, 0xabcd0000, c.max)
		if w2 != c.width {
			t.Errorf("begin(%d) width %d", c.max, w2)
		}
		wantLen := 4
		if c.width > 1 {
			wantLen = 5
		}
		if len(b) != wantLen || (b[0]&1 == 1) != (c.width > 1) {
			t.Errorf("begin(%d) = %x", c.max, b)
		}
		if c.width > 1 && b[4] != c.meta {
			t.Errorf("begin(%d) metainfo %#x", c.max, b[4])
		}
		// A length written at this width reads back.
		body := appendLen(append([]byte(nil), b...), w, 3)
		body = append(body, 1, 2, 3)
		r := open(body, 0xabcd0000)
		if n := r.length(1); n != 3 || r.err != nil {
			t.Errorf("width %d: length %d err %v", w, n, r.err)
		}
	}
}

func TestStructPackReaderErrorsAreSticky(t *testing.T) {
	body := binary.LittleEndian.AppendUint32(nil, 0x10)
	body = append(body, 0x05, 'a')
	r := open(body, 0x10)
	r.field = "name"
	if s := r.strAlias(); s != "" || !errors.Is(r.err, ErrStructPackLength) {
		t.Fatalf("got %q, %v", s, r.err)
	}
	first := r.err
	_ = r.i64()
	_ = r.flag()
	if r.err != first || r.finish() != first {
		t.Fatal("error was replaced after the first failure")
	}
	if got := first.Error(); got != "name at offset 4: struct_pack: length exceeds remaining bytes: 5 elements of >= 1 bytes, 1 bytes left" {
		t.Fatalf("message %q", got)
	}
	if _, err := DecodeGlobalView(nil); !errors.Is(err, ErrStructPackTruncated) {
		t.Fatalf("empty body: %v", err)
	}
}

func TestStructPackInt32VectorPaths(t *testing.T) {
	v := []int32{0, 1, -1, 255, 256, -2147483648, 2147483647, 0x01020304}
	fast := appendI32s([]byte{9}, v)
	portable := make([]byte, 4*len(v))
	putI32sLE(portable, v)
	if string(fast[1:]) != string(portable) || fast[0] != 9 {
		t.Fatalf("fast %x, portable %x", fast, portable)
	}
	if got := binary.LittleEndian.Uint32(portable[28:]); got != 0x01020304 {
		t.Fatalf("not little-endian: %#x", got)
	}
	back := make([]int32, len(v))
	getI32sLE(back, portable)
	body := appendLen(binary.LittleEndian.AppendUint32(nil, 0x10), 1, len(v))
	r := open(append(body, portable...), 0x10)
	got := r.i32s(nil)
	for i := range v {
		if back[i] != v[i] || got[i] != v[i] {
			t.Fatalf("element %d: portable %d, fast %d, want %d", i, back[i], got[i], v[i])
		}
	}
	if err := r.finish(); err != nil {
		t.Fatal(err)
	}
}
