package wire

import (
	"bytes"

	"github.com/tinylib/msgp/msgp"
)

// Reasons carried by a RequestError. They are the contract's closed set, so a client can
// branch on them; the message text is for people and may change.
const (
	ReasonUnsupportedContentType = "unsupported_content_type"
	ReasonInvalidMsgpack         = "invalid_msgpack"
	ReasonUnknownField           = "unknown_field"
	ReasonMissing                = "missing"
	ReasonInvalidType            = "invalid_type"
	ReasonInvalidValue           = "invalid_value"
	ReasonOutOfRange             = "out_of_range"
	ReasonUnsupported            = "unsupported"
	ReasonInvalidRegistration    = "invalid_registration"
)

// RequestError is a 400 validation failure. Reason is one of the Reason* constants; Field
// names the offending request field ("" when the error is about the whole body) and Index
// the offending array element (-1 when none), because the contract reports both so a
// client can point at its own mistake.
type RequestError struct {
	Msg, Reason, Field string
	Index              int
}

// Error reports reason and message; the field and index travel separately on the wire.
func (e *RequestError) Error() string { return e.Reason + ": " + e.Msg }

// newRequestError is the decoder's single constructor, so every error gets Index -1 unless
// an element is at fault.
func newRequestError(reason, field, msg string) *RequestError {
	return &RequestError{Msg: msg, Reason: reason, Field: field, Index: -1}
}

// AppendRequestError appends the contract's 400 body {error, reason, [field], [index]};
// field and index are left out when empty / negative, as upstream does.
func AppendRequestError(dst []byte, e *RequestError) []byte {
	n := uint32(2)
	if e.Field != "" {
		n++
	}
	if e.Index >= 0 {
		n++
	}
	dst = msgp.AppendMapHeader(dst, n)
	dst = msgp.AppendString(dst, "error")
	dst = msgp.AppendString(dst, e.Msg)
	dst = msgp.AppendString(dst, "reason")
	dst = msgp.AppendString(dst, e.Reason)
	if e.Field != "" {
		dst = msgp.AppendString(dst, "field")
		dst = msgp.AppendString(dst, e.Field)
	}
	if e.Index >= 0 {
		dst = msgp.AppendString(dst, "index")
		dst = msgp.AppendInt64(dst, int64(e.Index))
	}
	return dst
}

// AppendErrorMessage appends {"error": msg}, the body of service-level failures
// (404, 405, 500, 503), which carry no reason.
func AppendErrorMessage(dst []byte, msg string) []byte {
	dst = msgp.AppendMapHeader(dst, 1)
	dst = msgp.AppendString(dst, "error")
	return msgp.AppendString(dst, msg)
}

var msgpackMediaType = []byte("application/msgpack")

// IsMsgpackContentType reports whether a request Content-Type is accepted. Upstream
// matches a substring, so parameters ("; charset=...") and vendor wrappers pass too.
func IsMsgpackContentType(ct []byte) bool {
	return bytes.Contains(ct, msgpackMediaType)
}
