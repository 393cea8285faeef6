package wire

// coro_rpc framing (yalantinglibs): a 20-byte request header or 16-byte response header,
// raw little-endian, followed by the struct_pack body and an optional attachment.

import (
	"bufio"
	"crypto/md5"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
)

// Frame constants of the coro_rpc protocol.
const (
	RPCMagic               byte = 21 // first byte of every request and response header
	RPCVersion             byte = 0  // the only protocol version; peers reject anything newer
	RPCSerializeStructPack byte = 0  // serialize_type of struct_pack, the only one supported
	RPCRequestHeaderSize        = 20
	RPCResponseHeaderSize       = 16
	// DefaultRPCMaxBody bounds body plus attachment of one frame when the caller passes
	// no limit: far above any real request (a 1M-token query is 4 MiB) while keeping a
	// hostile length from reserving gigabytes.
	DefaultRPCMaxBody = 64 << 20
)

// Function ids of the conductor methods: the first 4 bytes (big-endian) of the MD5 of the
// qualified member name, see RPCFunctionID.
const (
	FuncQuery         uint32 = 0x479276ff
	FuncRegister      uint32 = 0x7027662f
	FuncUnregister    uint32 = 0x3dffb565
	FuncGetGlobalView uint32 = 0x8988faf0
	FuncListServices  uint32 = 0x0f74b1bb
)

// RPCServiceQualifiedPrefix is the C++ scope whose member names are hashed into the
// function ids ("…::Query" and so on).
const RPCServiceQualifiedPrefix = "mooncake::conductor::kvevent::ConductorService::"

// RPCFunctionID computes coro_rpc's id for a fully qualified function name, so a new
// method id can be derived instead of captured.
func RPCFunctionID(qualifiedName string) uint32 {
	sum := md5.Sum([]byte(qualifiedName))
	return binary.BigEndian.Uint32(sum[:4])
}

// RPCFunctionName returns the method name ("Query", …) for a known function id, or "".
func RPCFunctionName(id uint32) string {
	switch id {
	case FuncQuery:
		return "Query"
	case FuncRegister:
		return "Register"
	case FuncUnregister:
		return "Unregister"
	case FuncGetGlobalView:
		return "GetGlobalView"
	case FuncListServices:
		return "ListServices"
	}
	return ""
}

// Framing errors. A magic, version or size error leaves the stream unsynchronised, so the
// connection must be closed; a serialize-type error does not (the frame was consumed).
var (
	ErrRPCMagic         = errors.New("rpc frame: bad magic")
	ErrRPCVersion       = errors.New("rpc frame: unsupported protocol version")
	ErrRPCSerializeType = errors.New("rpc frame: unsupported serialize type")
	ErrRPCFrameTooLarge = errors.New("rpc frame: body exceeds limit")
)

// RPCRequestHeader is the coro_rpc req_header (the magic is implied).
type RPCRequestHeader struct {
	Version       uint8
	SerializeType uint8
	MsgType       uint8
	SeqNum        uint32
	FunctionID    uint32
	Length        uint32
	AttachLength  uint32
}

// RPCResponseHeader is the coro_rpc resp_header (the magic is implied). ErrCode 0 means
// the body is the method's return value; anything else is a framework error.
type RPCResponseHeader struct {
	Version      uint8
	ErrCode      uint8
	MsgType      uint8
	SeqNum       uint32
	Length       uint32
	AttachLength uint32
}

// ParseRPCRequestHeader parses and checks the first RPCRequestHeaderSize bytes of b. On
// ErrRPCSerializeType the returned header is complete.
func ParseRPCRequestHeader(b []byte) (RPCRequestHeader, error) {
	if len(b) < RPCRequestHeaderSize {
		return RPCRequestHeader{}, fmt.Errorf("rpc request header: %w", io.ErrUnexpectedEOF)
	}
	h := RPCRequestHeader{
		Version:       b[1],
		SerializeType: b[2],
		MsgType:       b[3],
		SeqNum:        binary.LittleEndian.Uint32(b[4:]),
		FunctionID:    binary.LittleEndian.Uint32(b[8:]),
		Length:        binary.LittleEndian.Uint32(b[12:]),
		AttachLength:  binary.LittleEndian.Uint32(b[16:]),
	}
	if b[0] != RPCMagic {
		return h, fmt.Errorf("%w: %d", ErrRPCMagic, b[0])
	}
	if h.Version > RPCVersion {
		return h, fmt.Errorf("%w: %d", ErrRPCVersion, h.Version)
	}
	if h.SerializeType != RPCSerializeStructPack {
		return h, fmt.Errorf("%w: %d", ErrRPCSerializeType, h.SerializeType)
	}
	return h, nil
}

// ParseRPCResponseHeader parses and checks the first RPCResponseHeaderSize bytes of b.
func ParseRPCResponseHeader(b []byte) (RPCResponseHeader, error) {
	if len(b) < RPCResponseHeaderSize {
		return RPCResponseHeader{}, fmt.Errorf("rpc response header: %w", io.ErrUnexpectedEOF)
	}
	h := RPCResponseHeader{
		Version:      b[1],
		ErrCode:      b[2],
		MsgType:      b[3],
		SeqNum:       binary.LittleEndian.Uint32(b[4:]),
		Length:       binary.LittleEndian.Uint32(b[8:]),
		AttachLength: binary.LittleEndian.Uint32(b[12:]),
	}
	if b[0] != RPCMagic {
		return h, fmt.Errorf("%w: %d", ErrRPCMagic, b[0])
	}
	if h.Version > RPCVersion {
		return h, fmt.Errorf("%w: %d", ErrRPCVersion, h.Version)
	}
	return h, nil
}

// rpcReadFrameBody reads length+attach bytes into buf (grown only when too small) and
// returns the body part; the attachment is consumed and dropped, as no conductor method
// uses one.
func rpcReadFrameBody(r *bufio.Reader, buf []byte, length, attach uint32, maxBody int) ([]byte, error) {
	if maxBody <= 0 {
		maxBody = DefaultRPCMaxBody
	}
	total := uint64(length) + uint64(attach)
	if total > uint64(maxBody) {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrRPCFrameTooLarge, total, maxBody)
	}
	n := int(total)
	if cap(buf) >= n {
		buf = buf[:n]
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, rpcBodyErr(err)
		}
		return buf[:length:length], nil
	}
	// A declared length is only a claim: grow with the bytes that actually arrive, so a
	// peer that announces 64 MiB and sends a few bytes does not reserve 64 MiB.
	buf = buf[:0]
	for len(buf) < n {
		step := min(n-len(buf), rpcBodyStep)
		if cap(buf)-len(buf) < step {
			buf = append(buf[:cap(buf)], make([]byte, max(step, cap(buf)))...)[:len(buf)]
		}
		m, err := io.ReadFull(r, buf[len(buf):len(buf)+step])
		buf = buf[:len(buf)+m]
		if err != nil {
			return nil, rpcBodyErr(err)
		}
	}
	return buf[:length:length], nil
}

// rpcBodyStep is how much of a large frame body is read (and allocated) at a time.
const rpcBodyStep = 64 << 10

func rpcBodyErr(err error) error {
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("read rpc body: %w", err)
}

// ReadRPCRequest reads one request frame. The body is read into buf when it fits (so a
// connection loop that passes the previous body back allocates nothing) and aliases it.
// maxBody <= 0 means DefaultRPCMaxBody. On ErrRPCSerializeType the frame has been
// consumed and the header is valid, so a server can answer and carry on; any other error
// means the connection is unusable.
func ReadRPCRequest(r *bufio.Reader, buf []byte, maxBody int) (RPCRequestHeader, []byte, error) {
	hb, err := r.Peek(RPCRequestHeaderSize)
	if err != nil {
		if err == io.EOF && len(hb) > 0 {
			err = io.ErrUnexpectedEOF
		}
		return RPCRequestHeader{}, nil, fmt.Errorf("read rpc request header: %w", err)
	}
	h, herr := ParseRPCRequestHeader(hb)
	if herr != nil && !errors.Is(herr, ErrRPCSerializeType) {
		return h, nil, herr
	}
	_, _ = r.Discard(RPCRequestHeaderSize) // cannot fail after a successful Peek
	body, err := rpcReadFrameBody(r, buf, h.Length, h.AttachLength, maxBody)
	if err != nil {
		return h, nil, err
	}
	return h, body, herr
}

// ReadRPCResponse reads one response frame, like ReadRPCRequest.
func ReadRPCResponse(r *bufio.Reader, buf []byte, maxBody int) (RPCResponseHeader, []byte, error) {
	hb, err := r.Peek(RPCResponseHeaderSize)
	if err != nil {
		if err == io.EOF && len(hb) > 0 {
			err = io.ErrUnexpectedEOF
		}
		return RPCResponseHeader{}, nil, fmt.Errorf("read rpc response header: %w", err)
	}
	h, err := ParseRPCResponseHeader(hb)
	if err != nil {
		return h, nil, err
	}
	_, _ = r.Discard(RPCResponseHeaderSize)
	body, err := rpcReadFrameBody(r, buf, h.Length, h.AttachLength, maxBody)
	if err != nil {
		return h, nil, err
	}
	return h, body, nil
}

// BeginRPCRequest appends a request header with a zero length; append the body after it
// and call FinishRPCRequest with the returned start. This encodes a frame in one buffer
// without copying the body.
func BeginRPCRequest(dst []byte, seq, funcID uint32) ([]byte, int) {
	start := len(dst)
	dst = append(dst, RPCMagic, RPCVersion, RPCSerializeStructPack, 0)
	dst = binary.LittleEndian.AppendUint32(dst, seq)
	dst = binary.LittleEndian.AppendUint32(dst, funcID)
	dst = binary.LittleEndian.AppendUint32(dst, 0)
	dst = binary.LittleEndian.AppendUint32(dst, 0)
	return dst, start
}

// FinishRPCRequest writes the body length of the request frame begun at start.
func FinishRPCRequest(frame []byte, start int) error {
	return rpcPatchLength(frame, start, RPCRequestHeaderSize, 12)
}

// BeginRPCResponse appends a response header with a zero length; see BeginRPCRequest.
func BeginRPCResponse(dst []byte, seq uint32, errCode uint8) ([]byte, int) {
	start := len(dst)
	dst = append(dst, RPCMagic, RPCVersion, errCode, 0)
	dst = binary.LittleEndian.AppendUint32(dst, seq)
	dst = binary.LittleEndian.AppendUint32(dst, 0)
	dst = binary.LittleEndian.AppendUint32(dst, 0)
	return dst, start
}

// FinishRPCResponse writes the body length of the response frame begun at start.
func FinishRPCResponse(frame []byte, start int) error {
	return rpcPatchLength(frame, start, RPCResponseHeaderSize, 8)
}

func rpcPatchLength(frame []byte, start, hdrSize, at int) error {
	if start < 0 || len(frame) < start+hdrSize {
		return fmt.Errorf("finish rpc frame: no header at %d", start)
	}
	n := len(frame) - start - hdrSize
	if uint64(n) > math.MaxUint32 {
		return fmt.Errorf("finish rpc frame: %w: %d bytes", ErrRPCFrameTooLarge, n)
	}
	binary.LittleEndian.PutUint32(frame[start+at:], uint32(n))
	return nil
}

// AppendRPCRequest appends a complete request frame carrying body.
func AppendRPCRequest(dst []byte, seq, funcID uint32, body []byte) []byte {
	dst, start := BeginRPCRequest(dst, seq, funcID)
	binary.LittleEndian.PutUint32(dst[start+12:], uint32(len(body)))
	return append(dst, body...)
}

// AppendRPCResponse appends a complete response frame carrying body.
func AppendRPCResponse(dst []byte, seq uint32, errCode uint8, body []byte) []byte {
	dst, start := BeginRPCResponse(dst, seq, errCode)
	binary.LittleEndian.PutUint32(dst[start+8:], uint32(len(body)))
	return append(dst, body...)
}

// coro_rpc framework error codes (coro_rpc::errc) a conductor server or client meets.
const (
	RPCErrcIOError               uint16 = 1
	RPCErrcNotConnected          uint16 = 2
	RPCErrcTimedOut              uint16 = 3
	RPCErrcInvalidArguments      uint16 = 4
	RPCErrcOperationCanceled     uint16 = 9
	RPCErrcThrowException        uint16 = 10
	RPCErrcFunctionNotRegistered uint16 = 11
	RPCErrcProtocolError         uint16 = 12
	RPCErrcUnknownVersion        uint16 = 13
	RPCErrcMessageTooLarge       uint16 = 14
	RPCErrcServerHasRan          uint16 = 15
	RPCErrcInvalidResult         uint16 = 16
)

// RPCFrameworkError is a coro_rpc framework failure (non-zero err_code in the response
// header), as opposed to a business RPCErrorCode inside the result.
type RPCFrameworkError struct {
	Code uint16
	Msg  string
}

// Error implements error.
func (e *RPCFrameworkError) Error() string {
	return fmt.Sprintf("coro_rpc error %d: %s", e.Code, e.Msg)
}

// AppendRPCFrameworkError appends a complete response frame reporting a framework error:
// codes up to 255 travel in the header with a struct_pack string body; larger codes set
// the header to 255 and send pair<uint16, string>, as coro_rpc does.
func AppendRPCFrameworkError(dst []byte, seq uint32, code uint16, msg string) []byte {
	hdrCode := uint8(code)
	if code > math.MaxUint8 {
		hdrCode = math.MaxUint8
	}
	dst, start := BeginRPCResponse(dst, seq, hdrCode)
	if code > math.MaxUint8 {
		var w int
		dst, w = spBegin(dst, spCodeU16StringPair, uint64(len(msg)))
		dst = binary.LittleEndian.AppendUint16(dst, code)
		dst = spAppendString(dst, w, msg)
	} else {
		var w int
		dst, w = spBegin(dst, spCodeString, uint64(len(msg)))
		dst = spAppendString(dst, w, msg)
	}
	binary.LittleEndian.PutUint32(dst[start+8:], uint32(len(dst)-start-RPCResponseHeaderSize))
	return dst
}

// DecodeRPCFrameworkError decodes the body of a response whose header err_code is
// non-zero; the message is copied.
func DecodeRPCFrameworkError(hdrErrCode uint8, body []byte) (*RPCFrameworkError, error) {
	if hdrErrCode == math.MaxUint8 {
		r := spOpen(body, spCodeU16StringPair)
		r.field = "code"
		var code uint16
		if b := r.bytes(2); len(b) == 2 {
			code = binary.LittleEndian.Uint16(b)
		}
		r.field = "message"
		msg := r.strCopy()
		if err := r.finish(); err != nil {
			return nil, rpcDecodeErr("framework error", err)
		}
		return &RPCFrameworkError{Code: code, Msg: msg}, nil
	}
	r := spOpen(body, spCodeString)
	r.field = "message"
	msg := r.strCopy()
	if err := r.finish(); err != nil {
		return nil, rpcDecodeErr("framework error", err)
	}
	return &RPCFrameworkError{Code: uint16(hdrErrCode), Msg: msg}, nil
}
