package wire

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
	} {
		if got := RPCFunctionID(RPCServiceQualifiedPrefix + c.name); got != c.id {
			t.Errorf("%s: MD5 id %#08x, constant %#08x", c.name, got, c.id)
		}
		if RPCFunctionName(c.id) != c.name {
			t.Errorf("RPCFunctionName(%#08x) = %q", c.id, RPCFunctionName(c.id))
		}
	}
	if RPCFunctionName(0x12345678) != "" {
		t.Error("unknown id has a name")
	}
}

func TestRPCRequestFrameBytes(t *testing.T) {
	body := rpcHex(t, rpcGoldenQueryArgs)
	frame := AppendRPCRequest([]byte{0xee}, 0x01020304, FuncQuery, body)
	want := append(rpcHex(t, "ee 15 00 00 00 04030201 ff769247"), byte(len(body)), 0, 0, 0, 0, 0, 0, 0)
	rpcEqualBytes(t, "request frame", frame, append(want, body...))

	f2, start := BeginRPCRequest([]byte{0xee}, 0x01020304, FuncQuery)
	f2 = append(f2, body...)
	if err := FinishRPCRequest(f2, start); err != nil {
		t.Fatal(err)
	}
	rpcEqualBytes(t, "begin/finish request", f2, frame)

	h, err := ParseRPCRequestHeader(frame[1:])
	if err != nil {
		t.Fatal(err)
	}
	if h != (RPCRequestHeader{SeqNum: 0x01020304, FunctionID: FuncQuery, Length: uint32(len(body))}) {
		t.Fatalf("parsed %+v", h)
	}
	if err := FinishRPCRequest(f2, len(f2)-5); err == nil {
		t.Fatal("finish without a header succeeded")
	}
}

func TestRPCResponseFrameBytes(t *testing.T) {
	body := rpcHex(t, rpcGoldenRegisterRespOK)
	frame := AppendRPCResponse(nil, 9, 0, body)
	want := rpcHex(t, "15 00 00 00 09000000 08000000 00000000")
	rpcEqualBytes(t, "response frame", frame, append(want, body...))
	f2, start := BeginRPCResponse(nil, 9, 0)
	f2 = AppendRPCRegisterResult(f2, RPCRegisterResult{"e", true})
	if err := FinishRPCResponse(f2, start); err != nil {
		t.Fatal(err)
	}
	rpcEqualBytes(t, "begin/finish response", f2, frame)
	h, err := ParseRPCResponseHeader(frame)
	if err != nil || h != (RPCResponseHeader{SeqNum: 9, Length: 8}) {
		t.Fatalf("parsed %+v %v", h, err)
	}
	bad := bytes.Clone(frame)
	bad[0] = 22
	if _, err := ParseRPCResponseHeader(bad); !errors.Is(err, ErrRPCMagic) {
		t.Fatalf("magic: %v", err)
	}
	bad[0], bad[1] = RPCMagic, 1
	if _, err := ParseRPCResponseHeader(bad); !errors.Is(err, ErrRPCVersion) {
		t.Fatalf("version: %v", err)
	}
	if _, err := ParseRPCResponseHeader(frame[:15]); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("short: %v", err)
	}
}

func rpcReader(b []byte) *bufio.Reader { return bufio.NewReaderSize(bytes.NewReader(b), 4096) }

func TestReadRPCRequestStream(t *testing.T) {
	q1, q2 := rpcHex(t, rpcGoldenQueryArgs), rpcHex(t, rpcGoldenQueryArgs300Hex)
	var stream []byte
	stream = AppendRPCRequest(stream, 1, FuncQuery, q1)
	stream = AppendRPCRequest(stream, 2, FuncQuery, q2)
	stream = AppendRPCRequest(stream, 3, FuncListServices, nil)
	r := rpcReader(stream)
	buf := make([]byte, 0, 16)
	for i, want := range [][]byte{q1, q2, {}} {
		h, body, err := ReadRPCRequest(r, buf, 0)
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if h.SeqNum != uint32(i+1) || !bytes.Equal(body, want) {
			t.Fatalf("frame %d: seq %d body %x", i, h.SeqNum, body)
		}
		buf = body[:0]
	}
	if _, _, err := ReadRPCRequest(r, buf, 0); !errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("clean end: %v", err)
	}
}

func TestReadRPCRequestRejects(t *testing.T) {
	good := AppendRPCRequest(nil, 1, FuncQuery, rpcHex(t, rpcGoldenQueryArgs))
	next := AppendRPCRequest(nil, 2, FuncGetGlobalView, nil)

	bad := bytes.Clone(good)
	bad[0] = 0x16
	if _, _, err := ReadRPCRequest(rpcReader(bad), nil, 0); !errors.Is(err, ErrRPCMagic) {
		t.Fatalf("magic: %v", err)
	}
	bad = bytes.Clone(good)
	bad[1] = 1
	if _, _, err := ReadRPCRequest(rpcReader(bad), nil, 0); !errors.Is(err, ErrRPCVersion) {
		t.Fatalf("version: %v", err)
	}
	// An unsupported serialize type consumes the frame; the stream continues.
	bad = bytes.Clone(good)
	bad[2] = 1
	r := rpcReader(append(bad, next...))
	h, body, err := ReadRPCRequest(r, nil, 0)
	if !errors.Is(err, ErrRPCSerializeType) || h.SeqNum != 1 || len(body) != len(good)-RPCRequestHeaderSize {
		t.Fatalf("serialize type: %+v %v", h, err)
	}
	if h, _, err := ReadRPCRequest(r, nil, 0); err != nil || h.FunctionID != FuncGetGlobalView {
		t.Fatalf("after serialize type error: %+v %v", h, err)
	}
	// Body plus attachment beyond the limit.
	if _, _, err := ReadRPCRequest(rpcReader(good), nil, len(good)-RPCRequestHeaderSize-1); !errors.Is(err, ErrRPCFrameTooLarge) {
		t.Fatalf("limit: %v", err)
	}
	huge := bytes.Clone(next)
	binary.LittleEndian.PutUint32(huge[12:], 0xffffffff)
	if _, _, err := ReadRPCRequest(rpcReader(huge), nil, 0); !errors.Is(err, ErrRPCFrameTooLarge) {
		t.Fatalf("default limit: %v", err)
	}
	// Truncated header and body.
	if _, _, err := ReadRPCRequest(rpcReader(good[:7]), nil, 0); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("short header: %v", err)
	}
	if _, _, err := ReadRPCRequest(rpcReader(good[:len(good)-1]), nil, 0); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("short body: %v", err)
	}
	// An attachment is read past and dropped.
	att := bytes.Clone(next)
	binary.LittleEndian.PutUint32(att[16:], 3)
	r = rpcReader(append(append(att, 'x', 'y', 'z'), good...))
	if h, body, err := ReadRPCRequest(r, nil, 0); err != nil || len(body) != 0 || h.AttachLength != 3 {
		t.Fatalf("attachment: %+v %x %v", h, body, err)
	}
	if h, _, err := ReadRPCRequest(r, nil, 0); err != nil || h.SeqNum != 1 {
		t.Fatalf("after attachment: %+v %v", h, err)
	}
}

func TestReadRPCResponse(t *testing.T) {
	stream := AppendRPCResponse(nil, 5, 0, rpcHex(t, rpcGoldenUnregisterRespOK))
	stream = AppendRPCFrameworkError(stream, 6, RPCErrcFunctionNotRegistered, "function not registered")
	r := rpcReader(stream)
	h, body, err := ReadRPCResponse(r, nil, 0)
	if err != nil || h.SeqNum != 5 || h.ErrCode != 0 {
		t.Fatalf("%+v %v", h, err)
	}
	if res, ec, err := DecodeRPCUnregisterResponse(body); err != nil || ec != RPCCodeOK || res.RemovedKey != "e|default|0" {
		t.Fatalf("body: %v", err)
	}
	h, body, err = ReadRPCResponse(r, nil, 0)
	if err != nil || h.SeqNum != 6 || h.ErrCode != uint8(RPCErrcFunctionNotRegistered) {
		t.Fatalf("%+v %v", h, err)
	}
	fe, err := DecodeRPCFrameworkError(h.ErrCode, body)
	if err != nil || fe.Code != RPCErrcFunctionNotRegistered || fe.Msg != "function not registered" {
		t.Fatalf("framework error: %+v %v", fe, err)
	}
	if _, _, err := ReadRPCResponse(rpcReader(stream[:20]), nil, 0); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("short body: %v", err)
	}
	if _, _, err := ReadRPCResponse(rpcReader(stream), nil, 3); !errors.Is(err, ErrRPCFrameTooLarge) {
		t.Fatalf("limit: %v", err)
	}
}

func TestRPCFrameworkErrorBodies(t *testing.T) {
	// Codes up to 255: header carries the code, body is struct_pack string.
	f := AppendRPCFrameworkError(nil, 1, RPCErrcInvalidArguments, "bad")
	rpcEqualBytes(t, "small code", f, rpcHex(t, "15 00 04 00 01000000 08000000 00000000 76facf9d 03 626164"))
	// Larger codes: header 255, body pair<uint16, string>.
	f = AppendRPCFrameworkError(nil, 1, 300, "x")
	rpcEqualBytes(t, "large code", f, rpcHex(t, "15 00 ff 00 01000000 08000000 00000000 4ce62b37 2c01 01 78"))
	fe, err := DecodeRPCFrameworkError(255, f[RPCResponseHeaderSize:])
	if err != nil || fe.Code != 300 || fe.Msg != "x" {
		t.Fatalf("decode pair: %+v %v", fe, err)
	}
	if !strings.Contains(fe.Error(), "300") {
		t.Fatalf("message %q", fe.Error())
	}
	// A long message switches the width like any body.
	long := strings.Repeat("m", 300)
	f = AppendRPCFrameworkError(nil, 1, RPCErrcProtocolError, long)
	if fe, err := DecodeRPCFrameworkError(f[2], f[RPCResponseHeaderSize:]); err != nil || fe.Msg != long || rpcMetaOf(f[RPCResponseHeaderSize:]) != 0x08 {
		t.Fatalf("long message: %v", err)
	}
	if _, err := DecodeRPCFrameworkError(4, rpcHex(t, "76facf9d 05 6162")); !errors.Is(err, ErrStructPackLength) {
		t.Fatalf("truncated message: %v", err)
	}
	if _, err := DecodeRPCFrameworkError(255, rpcHex(t, "4ce62b37 2c")); !errors.Is(err, ErrStructPackTruncated) {
		t.Fatalf("truncated pair: %v", err)
	}
}

func TestReadRPCRequestDoesNotAllocate(t *testing.T) {
	q, _ := rpcBench8K()
	frame := AppendRPCRequest(nil, 1, FuncQuery, AppendRPCQueryRequest(nil, &q))
	src := bytes.NewReader(frame)
	br := bufio.NewReaderSize(src, 64<<10)
	buf := make([]byte, 0, len(frame))
	var dq RPCQueryRequest
	out := make([]byte, 0, 1024)
	allocs := testing.AllocsPerRun(50, func() {
		src.Reset(frame)
		br.Reset(src)
		h, body, err := ReadRPCRequest(br, buf, 0)
		if err != nil || h.FunctionID != FuncQuery {
			t.Fatal(err)
		}
		if err := DecodeRPCQueryRequest(body, &dq); err != nil {
			t.Fatal(err)
		}
		buf = body[:0]
		out, _ = BeginRPCResponse(out[:0], h.SeqNum, 0)
		out = AppendRPCQueryError(out, RPCCodeOK)
	})
	if allocs != 0 {
		t.Fatalf("%v allocs per request", allocs)
	}
}
