package httpapi

import (
	"bytes"
	"unicode/utf8"

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

// Error reports reason and message; the field and index travel separately on the httpapi.
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
	dst = AppendSafeString(dst, e.Msg)
	dst = msgp.AppendString(dst, "reason")
	dst = msgp.AppendString(dst, e.Reason)
	if e.Field != "" {
		dst = msgp.AppendString(dst, "field")
		dst = AppendSafeString(dst, e.Field)
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
	return AppendSafeString(dst, msg)
}

// AppendSafeString appends s as a msgpack str that is always valid UTF-8: error texts
// echo client input (an unknown key, an instance id), and strict decoders such as
// Python's msgpack.unpackb refuse a str with invalid UTF-8, so the client would crash
// on the error itself. Each byte that is not part of a valid UTF-8 sequence is written
// as the four characters \xNN. Valid input is appended unchanged, without allocating.
func AppendSafeString(dst []byte, s string) []byte {
	if utf8.ValidString(s) {
		return msgp.AppendString(dst, s)
	}
	n := 0
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			n += 4
		} else {
			n += size
		}
		i += size
	}
	dst = appendStrHeader(dst, n)
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, '\\', 'x', hexDigits[s[i]>>4], hexDigits[s[i]&0xf])
		} else {
			dst = append(dst, s[i:i+size]...)
		}
		i += size
	}
	return dst
}

const hexDigits = "0123456789abcdef"

// appendStrHeader appends the msgpack str header for a string of n bytes.
func appendStrHeader(dst []byte, n int) []byte {
	switch {
	case n < 32:
		return append(dst, 0xa0|byte(n))
	case n < 1<<8:
		return append(dst, 0xd9, byte(n))
	case n < 1<<16:
		return append(dst, 0xda, byte(n>>8), byte(n))
	}
	return append(dst, 0xdb, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
}

var msgpackMediaType = []byte("application/msgpack")

// IsMsgpackContentType reports whether a request Content-Type is accepted. Upstream
// matches a substring, so parameters ("; charset=...") and vendor wrappers pass too.
func IsMsgpackContentType(ct []byte) bool {
	return bytes.Contains(ct, msgpackMediaType)
}
