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
	h := RequestHeader{Version: b[1], SerializeType: b[2], MsgType: b[3],
		SeqNum: u32At(b, 4), FunctionID: u32At(b, 8), Length: u32At(b, 12), AttachLength: u32At(b, 16)}
	if err := checkMagicVersion(b); err != nil {
		return h, err
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
	h := ResponseHeader{Version: b[1], ErrCode: b[2], MsgType: b[3],
		SeqNum: u32At(b, 4), Length: u32At(b, 8), AttachLength: u32At(b, 12)}
	return h, checkMagicVersion(b)
}

// u32At reads the little-endian uint32 at b[i:].
func u32At(b []byte, i int) uint32 { return binary.LittleEndian.Uint32(b[i:]) }

// checkMagicVersion checks the first two bytes every frame header starts with: the
// magic and a protocol version this package speaks.
func checkMagicVersion(b []byte) error {
	if b[0] != Magic {
		return fmt.Errorf("%w: %d", ErrMagic, b[0])
	}
	if b[1] > Version {
		return fmt.Errorf("%w: %d", ErrVersion, b[1])
	}
	return nil
}

// lengths are the body and attachment lengths a header announces.
func (h RequestHeader) lengths() (body, attach uint32)  { return h.Length, h.AttachLength }
func (h ResponseHeader) lengths() (body, attach uint32) { return h.Length, h.AttachLength }

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
	return readFrame(r, buf, maxBody, RequestHeaderSize, "request", ParseRequestHeader)
}

// ReadResponse reads one response frame, like ReadRequest.
func ReadResponse(r *bufio.Reader, buf []byte, maxBody int) (ResponseHeader, []byte, error) {
	return readFrame(r, buf, maxBody, ResponseHeaderSize, "response", ParseResponseHeader)
}

// readFrame reads one frame: its header of size bytes (what names it in errors), checked
// by parse, then its body. A header error that leaves the stream in step
// (ErrSerializeType: the header is complete) is returned with the body, read all the same.
func readFrame[H interface{ lengths() (uint32, uint32) }](r *bufio.Reader, buf []byte, maxBody, size int, what string,
	parse func([]byte) (H, error)) (H, []byte, error) {
	hb, err := r.Peek(size)
	if err != nil {
		if err == io.EOF && len(hb) > 0 {
			err = io.ErrUnexpectedEOF
		}
		var zero H
		return zero, nil, fmt.Errorf("read rpc %s header: %w", what, err)
	}
	h, herr := parse(hb)
	if herr != nil && !errors.Is(herr, ErrSerializeType) {
		return h, nil, herr
	}
	_, _ = r.Discard(size) // cannot fail after a successful Peek
	length, attach := h.lengths()
	body, err := readFrameBody(r, buf, length, attach, maxBody)
	if err != nil {
		return h, nil, err
	}
	return h, body, herr
}

// BeginRequest appends a request header with a zero length; append the body after it
// and call FinishRequest with the returned start. This encodes a frame in one buffer
// without copying the body.
func BeginRequest(dst []byte, seq, funcID uint32) ([]byte, int) {
	return beginFrame(dst, SerializeStructPack, seq, funcID, 0, 0)
}

// beginFrame appends a frame header: the magic, the version, b2 (the serialize type or
// the error code), a zero msg_type, then words, little-endian (the lengths zero: Finish*
// writes the body's), and returns where it starts.
func beginFrame(dst []byte, b2 byte, words ...uint32) ([]byte, int) {
	start := len(dst)
	dst = append(dst, Magic, Version, b2, 0)
	for _, w := range words {
		dst = binary.LittleEndian.AppendUint32(dst, w)
	}
	return dst, start
}

// FinishRequest writes the body length of the request frame begun at start.
func FinishRequest(frame []byte, start int) error {
	return patchLength(frame, start, RequestHeaderSize, 12)
}

// BeginResponse appends a response header with a zero length; see BeginRequest.
func BeginResponse(dst []byte, seq uint32, errCode uint8) ([]byte, int) {
	return beginFrame(dst, errCode, seq, 0, 0)
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

// coro_rpc framework error codes (coro_rpc::errc) a conductor server or client meets:
// those of the connection itself,
const (
	ErrcIOError      uint16 = 1
	ErrcNotConnected uint16 = 2
	ErrcTimedOut     uint16 = 3
)

// and those of a call.
const (
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
