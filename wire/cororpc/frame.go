package cororpc

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
	Magic               byte = 21 // first byte of every request and response header
	Version             byte = 0  // the only protocol version; peers reject anything newer
	SerializeStructPack byte = 0  // serialize_type of struct_pack, the only one supported
	RequestHeaderSize        = 20
	ResponseHeaderSize       = 16
	// DefaultMaxBody bounds body plus attachment of one frame when the caller passes
	// no limit: far above any real request (a 1M-token query is 4 MiB) while keeping a
	// hostile length from reserving gigabytes.
	DefaultMaxBody = 64 << 20
)

// Function ids of the conductor methods: the first 4 bytes (big-endian) of the MD5 of the
// qualified member name, see FunctionID.
const (
	FuncQuery         uint32 = 0x479276ff
	FuncRegister      uint32 = 0x7027662f
	FuncUnregister    uint32 = 0x3dffb565
	FuncGetGlobalView uint32 = 0x8988faf0
	FuncListServices  uint32 = 0x0f74b1bb
)

// ServiceQualifiedPrefix is the C++ scope whose member names are hashed into the
// function ids ("…::Query" and so on).
const ServiceQualifiedPrefix = "mooncake::conductor::kvevent::ConductorService::"

// FunctionID computes coro_rpc's id for a fully qualified function name, so a new
// method id can be derived instead of captured.
func FunctionID(qualifiedName string) uint32 {
	sum := md5.Sum([]byte(qualifiedName))
	return binary.BigEndian.Uint32(sum[:4])
}

// FunctionName returns the method name ("Query", …) for a known function id, or "".
func FunctionName(id uint32) string {
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
	case FuncRegisterEx:
		return "RegisterEx"
	case FuncUnregisterAdapter:
		return "UnregisterAdapter"
	case FuncListServiceDetails:
		return "ListServiceDetails"
	}
	return ""
}

// Framing errors. A magic, version or size error leaves the stream unsynchronised, so the
// connection must be closed; a serialize-type error does not (the frame was consumed).
var (
	ErrMagic         = errors.New("rpc frame: bad magic")
	ErrVersion       = errors.New("rpc frame: unsupported protocol version")
	ErrSerializeType = errors.New("rpc frame: unsupported serialize type")
	ErrFrameTooLarge = errors.New("rpc frame: body exceeds limit")
)

// RequestHeader is the coro_rpc req_header (the magic is implied).
type RequestHeader struct {
	Version       uint8
	SerializeType uint8
	MsgType       uint8
	SeqNum        uint32
	FunctionID    uint32
	Length        uint32
	AttachLength  uint32
}

// ResponseHeader is the coro_rpc resp_header (the magic is implied). ErrCode 0 means
// the body is the method's return value; anything else is a framework error.
type ResponseHeader struct {
	Version      uint8
	ErrCode      uint8
	MsgType      uint8
	SeqNum       uint32
	Length       uint32
	AttachLength uint32
}

// ParseRequestHeader parses and checks the first RequestHeaderSize bytes of b. On
// ErrSerializeType the returned header is complete.
func ParseRequestHeader(b []byte) (RequestHeader, error) {
	if len(b) < RequestHeaderSize {
		return RequestHeader{}, fmt.Errorf("rpc request header: %w", io.ErrUnexpectedEOF)
	}
	h := RequestHeader{
		Version:       b[1],
		SerializeType: b[2],
		MsgType:       b[3],
		SeqNum:        binary.LittleEndian.Uint32(b[4:]),
		FunctionID:    binary.LittleEndian.Uint32(b[8:]),
		Length:        binary.LittleEndian.Uint32(b[12:]),
		AttachLength:  binary.LittleEndian.Uint32(b[16:]),
	}
	if b[0] != Magic {
		return h, fmt.Errorf("%w: %d", ErrMagic, b[0])
	}
	if h.Version > Version {
		return h, fmt.Errorf("%w: %d", ErrVersion, h.Version)
	}
	if h.SerializeType != SerializeStructPack {
		return h, fmt.Errorf("%w: %d", ErrSerializeType, h.SerializeType)
	}
	return h, nil
}

// ParseResponseHeader parses and checks the first ResponseHeaderSize bytes of b.
func ParseResponseHeader(b []byte) (ResponseHeader, error) {
	if len(b) < ResponseHeaderSize {
		return ResponseHeader{}, fmt.Errorf("rpc response header: %w", io.ErrUnexpectedEOF)
	}
	h := ResponseHeader{
		Version:      b[1],
		ErrCode:      b[2],
		MsgType:      b[3],
		SeqNum:       binary.LittleEndian.Uint32(b[4:]),
		Length:       binary.LittleEndian.Uint32(b[8:]),
		AttachLength: binary.LittleEndian.Uint32(b[12:]),
	}
	if b[0] != Magic {
		return h, fmt.Errorf("%w: %d", ErrMagic, b[0])
	}
	if h.Version > Version {
		return h, fmt.Errorf("%w: %d", ErrVersion, h.Version)
	}
	return h, nil
}

// readFrameBody reads length+attach bytes into buf (grown only when too small) and
// returns the body part; the attachment is consumed and dropped, as no conductor method
// uses one.
func readFrameBody(r *bufio.Reader, buf []byte, length, attach uint32, maxBody int) ([]byte, error) {
	if maxBody <= 0 {
		maxBody = DefaultMaxBody
	}
	total := uint64(length) + uint64(attach)
	if total > uint64(maxBody) {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrFrameTooLarge, total, maxBody)
	}
	n := int(total)
	if cap(buf) >= n {
		buf = buf[:n]
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, bodyErr(err)
		}
		return buf[:length:length], nil
	}
	// A declared length is only a claim: grow with the bytes that actually arrive, so a
	// peer that announces 64 MiB and sends a few bytes does not reserve 64 MiB.
	buf = buf[:0]
	for len(buf) < n {
		step := min(n-len(buf), bodyStep)
		if cap(buf)-len(buf) < step {
			buf = append(buf[:cap(buf)], make([]byte, max(step, cap(buf)))...)[:len(buf)]
		}
		m, err := io.ReadFull(r, buf[len(buf):len(buf)+step])
		buf = buf[:len(buf)+m]
		if err != nil {
			return nil, bodyErr(err)
		}
	}
	return buf[:length:length], nil
}

// bodyStep is how much of a large frame body is read (and allocated) at a time.
const bodyStep = 64 << 10

func bodyErr(err error) error {
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("read rpc body: %w", err)
}

// ReadRequest reads one request frame. The body is read into buf when it fits (so a
// connection loop that passes the previous body back allocates nothing) and aliases it.
// maxBody <= 0 means DefaultMaxBody. On ErrSerializeType the frame has been
// consumed and the header is valid, so a server can answer and carry on; any other error
// means the connection is unusable.
func ReadRequest(r *bufio.Reader, buf []byte, maxBody int) (RequestHeader, []byte, error) {
	hb, err := r.Peek(RequestHeaderSize)
	if err != nil {
		if err == io.EOF && len(hb) > 0 {
			err = io.ErrUnexpectedEOF
		}
		return RequestHeader{}, nil, fmt.Errorf("read rpc request header: %w", err)
	}
	h, herr := ParseRequestHeader(hb)
	if herr != nil && !errors.Is(herr, ErrSerializeType) {
		return h, nil, herr
	}
	_, _ = r.Discard(RequestHeaderSize) // cannot fail after a successful Peek
	body, err := readFrameBody(r, buf, h.Length, h.AttachLength, maxBody)
	if err != nil {
		return h, nil, err
	}
	return h, body, herr
}

// ReadResponse reads one response frame, like ReadRequest.
func ReadResponse(r *bufio.Reader, buf []byte, maxBody int) (ResponseHeader, []byte, error) {
	hb, err := r.Peek(ResponseHeaderSize)
	if err != nil {
		if err == io.EOF && len(hb) > 0 {
			err = io.ErrUnexpectedEOF
		}
		return ResponseHeader{}, nil, fmt.Errorf("read rpc response header: %w", err)
	}
	h, err := ParseResponseHeader(hb)
	if err != nil {
		return h, nil, err
	}
	_, _ = r.Discard(ResponseHeaderSize)
	body, err := readFrameBody(r, buf, h.Length, h.AttachLength, maxBody)
	if err != nil {
		return h, nil, err
	}
	return h, body, nil
}

// BeginRequest appends a request header with a zero length; append the body after it
// and call FinishRequest with the returned start. This encodes a frame in one buffer
// without copying the body.
func BeginRequest(dst []byte, seq, funcID uint32) ([]byte, int) {
	start := len(dst)
	dst = append(dst, Magic, Version, SerializeStructPack, 0)
	dst = binary.LittleEndian.AppendUint32(dst, seq)
	dst = binary.LittleEndian.AppendUint32(dst, funcID)
	dst = binary.LittleEndian.AppendUint32(dst, 0)
	dst = binary.LittleEndian.AppendUint32(dst, 0)
	return dst, start
}

// FinishRequest writes the body length of the request frame begun at start.
func FinishRequest(frame []byte, start int) error {
	return patchLength(frame, start, RequestHeaderSize, 12)
}

// BeginResponse appends a response header with a zero length; see BeginRequest.
func BeginResponse(dst []byte, seq uint32, errCode uint8) ([]byte, int) {
	start := len(dst)
	dst = append(dst, Magic, Version, errCode, 0)
	dst = binary.LittleEndian.AppendUint32(dst, seq)
	dst = binary.LittleEndian.AppendUint32(dst, 0)
	dst = binary.LittleEndian.AppendUint32(dst, 0)
	return dst, start
}

// FinishResponse writes the body length of the response frame begun at start.
func FinishResponse(frame []byte, start int) error {
	return patchLength(frame, start, ResponseHeaderSize, 8)
}

func patchLength(frame []byte, start, hdrSize, at int) error {
	if start < 0 || len(frame) < start+hdrSize {
		return fmt.Errorf("finish rpc frame: no header at %d", start)
	}
	n := len(frame) - start - hdrSize
	if uint64(n) > math.MaxUint32 {
		return fmt.Errorf("finish rpc frame: %w: %d bytes", ErrFrameTooLarge, n)
	}
	binary.LittleEndian.PutUint32(frame[start+at:], uint32(n))
	return nil
}

// AppendRequest appends a complete request frame carrying body.
func AppendRequest(dst []byte, seq, funcID uint32, body []byte) []byte {
	dst, start := BeginRequest(dst, seq, funcID)
	binary.LittleEndian.PutUint32(dst[start+12:], uint32(len(body)))
	return append(dst, body...)
}

// AppendResponse appends a complete response frame carrying body.
func AppendResponse(dst []byte, seq uint32, errCode uint8, body []byte) []byte {
	dst, start := BeginResponse(dst, seq, errCode)
	binary.LittleEndian.PutUint32(dst[start+8:], uint32(len(body)))
	return append(dst, body...)
}

// coro_rpc framework error codes (coro_rpc::errc) a conductor server or client meets.
const (
	ErrcIOError               uint16 = 1
	ErrcNotConnected          uint16 = 2
	ErrcTimedOut              uint16 = 3
	ErrcInvalidArguments      uint16 = 4
	ErrcOperationCanceled     uint16 = 9
	ErrcThrowException        uint16 = 10
	ErrcFunctionNotRegistered uint16 = 11
	ErrcProtocolError         uint16 = 12
	ErrcUnknownVersion        uint16 = 13
	ErrcMessageTooLarge       uint16 = 14
	ErrcServerHasRan          uint16 = 15
	ErrcInvalidResult         uint16 = 16
)

// FrameworkError is a coro_rpc framework failure (non-zero err_code in the response
// header), as opposed to a business ErrorCode inside the result.
type FrameworkError struct {
	Code uint16
	Msg  string
}

// Error implements error.
func (e *FrameworkError) Error() string {
	return fmt.Sprintf("coro_rpc error %d: %s", e.Code, e.Msg)
}

// AppendFrameworkError appends a complete response frame reporting a framework error:
// codes up to 255 travel in the header with a struct_pack string body; larger codes set
// the header to 255 and send pair<uint16, string>, as coro_rpc does.
func AppendFrameworkError(dst []byte, seq uint32, code uint16, msg string) []byte {
	hdrCode := uint8(code)
	if code > math.MaxUint8 {
		hdrCode = math.MaxUint8
	}
	dst, start := BeginResponse(dst, seq, hdrCode)
	if code > math.MaxUint8 {
		var w int
		dst, w = begin(dst, codeU16StringPair, uint64(len(msg)))
		dst = binary.LittleEndian.AppendUint16(dst, code)
		dst = appendString(dst, w, msg)
	} else {
		var w int
		dst, w = begin(dst, codeString, uint64(len(msg)))
		dst = appendString(dst, w, msg)
	}
	binary.LittleEndian.PutUint32(dst[start+8:], uint32(len(dst)-start-ResponseHeaderSize))
	return dst
}

// DecodeFrameworkError decodes the body of a response whose header err_code is
// non-zero; the message is copied.
func DecodeFrameworkError(hdrErrCode uint8, body []byte) (*FrameworkError, error) {
	if hdrErrCode == math.MaxUint8 {
		r := open(body, codeU16StringPair)
		r.field = "code"
		var code uint16
		if b := r.bytes(2); len(b) == 2 {
			code = binary.LittleEndian.Uint16(b)
		}
		r.field = "message"
		msg := r.strCopy()
		if err := r.finish(); err != nil {
			return nil, decodeErr("framework error", err)
		}
		return &FrameworkError{Code: code, Msg: msg}, nil
	}
	r := open(body, codeString)
	r.field = "message"
	msg := r.strCopy()
	if err := r.finish(); err != nil {
		return nil, decodeErr("framework error", err)
	}
	return &FrameworkError{Code: uint16(hdrErrCode), Msg: msg}, nil
}
