package cororpc

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"testing"
)

func TestRPCFunctionIDsAreMD5OfQualifiedNames(t *testing.T) {
	for _, c := range []struct {
		name string
		id   uint32
	}{
		{"Query", FuncQuery}, {"Register", FuncRegister}, {"Unregister", FuncUnregister},
		{"GetGlobalView", FuncGetGlobalView}, {"ListServices", FuncListServices},
		{"RegisterEx", FuncRegisterEx}, {"UnregisterAdapter", FuncUnregisterAdapter},
		{"ListServiceDetails", FuncListServiceDetails},
	} {
		if got := FunctionID(ServiceQualifiedPrefix + c.name); got != c.id {
			t.Errorf("%s: MD5 id %#08x, constant %#08x", c.name, got, c.id)
		}
		if FunctionName(c.id) != c.name {
			t.Errorf("FunctionName(%#08x) = %q", c.id, FunctionName(c.id))
		}
	}
	if FunctionName(0x12345678) != "" {
		t.Error("unknown id has a name")
	}
}

func TestRPCRequestFrameBytes(t *testing.T) {
	body := rpcHex(t, rpcGoldenQueryArgs)
	frame := AppendRequest([]byte{0xee}, 0x01020304, FuncQuery, body)
	want := append(rpcHex(t, "ee 15 00 00 00 04030201 ff769247"), byte(len(body)), 0, 0, 0, 0, 0, 0, 0)
	rpcEqualBytes(t, "request frame", frame, append(want, body...))

	f2, start := BeginRequest([]byte{0xee}, 0x01020304, FuncQuery)
	f2 = append(f2, body...)
	if err := FinishRequest(f2, start); err != nil {
		t.Fatal(err)
	}
	rpcEqualBytes(t, "begin/finish request", f2, frame)

	h, err := ParseRequestHeader(frame[1:])
	if err != nil {
		t.Fatal(err)
	}
	if h != (RequestHeader{SeqNum: 0x01020304, FunctionID: FuncQuery, Length: uint32(len(body))}) {
		t.Fatalf("parsed %+v", h)
	}
	if err := FinishRequest(f2, len(f2)-5); err == nil {
		t.Fatal("finish without a header succeeded")
	}
}

func TestRPCResponseFrameBytes(t *testing.T) {
	body := rpcHex(t, rpcGoldenRegisterRespOK)
	frame := AppendResponse(nil, 9, 0, body)
	want := rpcHex(t, "15 00 00 00 09000000 08000000 00000000")
	rpcEqualBytes(t, "response frame", frame, append(want, body...))
	f2, start := BeginResponse(nil, 9, 0)
	f2 = AppendRegisterResult(f2, RegisterResult{"e", true})
	if err := FinishResponse(f2, start); err != nil {
		t.Fatal(err)
	}
	rpcEqualBytes(t, "begin/finish response", f2, frame)
	h, err := ParseResponseHeader(frame)
	if err != nil || h != (ResponseHeader{SeqNum: 9, Length: 8}) {
		t.Fatalf("parsed %+v %v", h, err)
	}
	bad := bytes.Clone(frame)
	bad[0] = 22
	if _, err := ParseResponseHeader(bad); !errors.Is(err, ErrMagic) {
		t.Fatalf("magic: %v", err)
	}
	bad[0], bad[1] = Magic, 1
	if _, err := ParseResponseHeader(bad); !errors.Is(err, ErrVersion) {
		t.Fatalf("version: %v", err)
	}
	if _, err := ParseResponseHeader(frame[:15]); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("short: %v", err)
	}
}

func bufReader(b []byte) *bufio.Reader { return bufio.NewReaderSize(bytes.NewReader(b), 4096) }

func TestReadRPCRequestStream(t *testing.T) {
	q1, q2 := rpcHex(t, rpcGoldenQueryArgs), rpcHex(t, rpcGoldenQueryArgs300Hex)
	var stream []byte
	stream = AppendRequest(stream, 1, FuncQuery, q1)
	stream = AppendRequest(stream, 2, FuncQuery, q2)
	stream = AppendRequest(stream, 3, FuncListServices, nil)
	r := bufReader(stream)
	buf := make([]byte, 0, 16)
	for i, want := range [][]byte{q1, q2, {}} {
		h, body, err := ReadRequest(r, buf, 0)
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if h.SeqNum != uint32(i+1) || !bytes.Equal(body, want) {
			t.Fatalf("frame %d: seq %d body %x", i, h.SeqNum, body)
		}
		buf = body[:0]
	}
	if _, _, err := ReadRequest(r, buf, 0); !errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("clean end: %v", err)
	}
}

func TestReadRPCRequestRejects(t *testing.T) {
	good := AppendRequest(nil, 1, FuncQuery, rpcHex(t, rpcGoldenQueryArgs))
	next := AppendRequest(nil, 2, FuncGetGlobalView, nil)

	bad := bytes.Clone(good)
	bad[0] = 0x16
	if _, _, err := ReadRequest(bufReader(bad), nil, 0); !errors.Is(err, ErrMagic) {
		t.Fatalf("magic: %v", err)
	}
	bad = bytes.Clone(good)
	bad[1] = 1
	if _, _, err := ReadRequest(bufReader(bad), nil, 0); !errors.Is(err, ErrVersion) {
		t.Fatalf("version: %v", err)
	}
	// An unsupported serialize type consumes the frame; the stream continues.
	bad = bytes.Clone(good)
	bad[2] = 1
	r := bufReader(append(bad, next...))
	h, body, err := ReadRequest(r, nil, 0)
	if !errors.Is(err, ErrSerializeType) || h.SeqNum != 1 || len(body) != len(good)-RequestHeaderSize {
		t.Fatalf("serialize type: %+v %v", h, err)
	}
	if h, _, err := ReadRequest(r, nil, 0); err != nil || h.FunctionID != FuncGetGlobalView {
		t.Fatalf("after serialize type error: %+v %v", h, err)
	}
	// Body plus attachment beyond the limit.
	if _, _, err := ReadRequest(bufReader(good), nil, len(good)-RequestHeaderSize-1); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("limit: %v", err)
	}
	huge := bytes.Clone(next)
	binary.LittleEndian.PutUint32(huge[12:], 0xffffffff)
	if _, _, err := ReadRequest(bufReader(huge), nil, 0); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("default limit: %v", err)
	}
	// Truncated header and body.
	if _, _, err := ReadRequest(bufReader(good[:7]), nil, 0); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("short header: %v", err)
	}
	if _, _, err := ReadRequest(bufReader(good[:len(good)-1]), nil, 0); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("short body: %v", err)
	}
	// An attachment is read past and dropped.
	att := bytes.Clone(next)
	binary.LittleEndian.PutUint32(att[16:], 3)
	r = bufReader(append(append(att, 'x', 'y', 'z'), good...))
	if h, body, err := ReadRequest(r, nil, 0); err != nil || len(body) != 0 || h.AttachLength != 3 {
		t.Fatalf("attachment: %+v %x %v", h, body, err)
	}
	if h, _, err := ReadRequest(r, nil, 0); err != nil || h.SeqNum != 1 {
		t.Fatalf("after attachment: %+v %v", h, err)
	}
}

func TestReadRPCResponse(t *testing.T) {
	stream := AppendResponse(nil, 5, 0, rpcHex(t, rpcGoldenUnregisterRespOK))
	stream = AppendFrameworkError(stream, 6, ErrcFunctionNotRegistered, "function not registered")
	r := bufReader(stream)
	h, body, err := ReadResponse(r, nil, 0)
	if err != nil || h.SeqNum != 5 || h.ErrCode != 0 {
		t.Fatalf("%+v %v", h, err)
	}
	if res, ec, err := DecodeUnregisterResponse(body); err != nil || ec != CodeOK || res.RemovedKey != "e|default|0" {
		t.Fatalf("body: %v", err)
	}
	h, body, err = ReadResponse(r, nil, 0)
	if err != nil || h.SeqNum != 6 || h.ErrCode != uint8(ErrcFunctionNotRegistered) {
		t.Fatalf("%+v %v", h, err)
	}
	fe, err := DecodeFrameworkError(h.ErrCode, body)
	if err != nil || fe.Code != ErrcFunctionNotRegistered || fe.Msg != "function not registered" {
		t.Fatalf("framework error: %+v %v", fe, err)
	}
	if _, _, err := ReadResponse(bufReader(stream[:20]), nil, 0); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("short body: %v", err)
	}
	if _, _, err := ReadResponse(bufReader(stream), nil, 3); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("limit: %v", err)
	}
}

func TestRPCFrameworkErrorBodies(t *testing.T) {
	// Codes up to 255: header carries the code, body is struct_pack string.
	f := AppendFrameworkError(nil, 1, ErrcInvalidArguments, "bad")
	rpcEqualBytes(t, "small code", f, rpcHex(t, "15 00 04 00 01000000 08000000 00000000 76facf9d 03 626164"))
	// Larger codes: header 255, body pair<uint16, string>.
	f = AppendFrameworkError(nil, 1, 300, "x")
	rpcEqualBytes(t, "large code", f, rpcHex(t, "15 00 ff 00 01000000 08000000 00000000 4ce62b37 2c01 01 78"))
	fe, err := DecodeFrameworkError(255, f[ResponseHeaderSize:])
	if err != nil || fe.Code != 300 || fe.Msg != "x" {
		t.Fatalf("decode pair: %+v %v", fe, err)
	}
	if !strings.Contains(fe.Error(), "300") {
		t.Fatalf("message %q", fe.Error())
	}
	// A long message switches the width like any body.
	long := strings.Repeat("m", 300)
	f = AppendFrameworkError(nil, 1, ErrcProtocolError, long)
	if fe, err := DecodeFrameworkError(f[2], f[ResponseHeaderSize:]); err != nil || fe.Msg != long || rpcMetaOf(f[ResponseHeaderSize:]) != 0x08 {
		t.Fatalf("long message: %v", err)
	}
	if _, err := DecodeFrameworkError(4, rpcHex(t, "76facf9d 05 6162")); !errors.Is(err, ErrStructPackLength) {
		t.Fatalf("truncated message: %v", err)
	}
	if _, err := DecodeFrameworkError(255, rpcHex(t, "4ce62b37 2c")); !errors.Is(err, ErrStructPackTruncated) {
		t.Fatalf("truncated pair: %v", err)
	}
}

func TestReadRPCRequestDoesNotAllocate(t *testing.T) {
	q, _ := rpcBench8K()
	frame := AppendRequest(nil, 1, FuncQuery, AppendQueryRequest(nil, &q))
	src := bytes.NewReader(frame)
	br := bufio.NewReaderSize(src, 64<<10)
	buf := make([]byte, 0, len(frame))
	var dq QueryRequest
	out := make([]byte, 0, 1024)
	allocs := testing.AllocsPerRun(50, func() {
		src.Reset(frame)
		br.Reset(src)
		h, body, err := ReadRequest(br, buf, 0)
		if err != nil || h.FunctionID != FuncQuery {
			t.Fatal(err)
		}
		if err := DecodeQueryRequest(body, &dq); err != nil {
			t.Fatal(err)
		}
		buf = body[:0]
		out, _ = BeginResponse(out[:0], h.SeqNum, 0)
		out = AppendQueryError(out, CodeOK)
	})
	if allocs != 0 {
		t.Fatalf("%v allocs per request", allocs)
	}
}
