package service

import "fmt"

// Code classifies a service-level failure; each protocol maps it to its own status.
type Code int

// Service error codes.
const (
	CodeInvalidParams Code = iota + 1 // HTTP 400, RPC INVALID_PARAMS
	CodeNotFound                      // HTTP 404, RPC SERVICE_NOT_FOUND
	CodeUnavailable                   // HTTP 503, RPC CONDUCTOR_UNAVAILABLE
	CodeInternal                      // HTTP 500, RPC INTERNAL_ERROR
)

// Error is a service-level failure. Reason and Field follow the HTTP contract when the
// failure concerns validation (Reason empty for operational errors).
type Error struct {
	Code   Code
	Reason string
	Field  string
	// Index is the offending array element when HasIndex is set.
	Index    int
	HasIndex bool
	Msg      string
}

// Error formats the message, with the reason and field when there is one.
func (e *Error) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("%s (%s: %s)", e.Msg, e.Reason, e.Field)
	}
	return e.Msg
}

// StoppingError is the answer to every request once Stop has begun: HTTP 503, RPC
// CONDUCTOR_UNAVAILABLE.
func StoppingError() *Error { return &Error{Code: CodeUnavailable, Msg: "conductor is stopping"} }

// InvalidRegistration is a refused registration (reason invalid_registration), for the
// refusals decided outside the service layer (the cluster registry's transactions).
func InvalidRegistration(format string, args ...any) *Error {
	return invalidRegistration(format, args...)
}

func invalidField(reason, field, msg string) *Error {
	return &Error{Code: CodeInvalidParams, Reason: reason, Field: field, Msg: msg}
}

func invalidRegistration(format string, args ...any) *Error {
	return &Error{Code: CodeInvalidParams, Reason: "invalid_registration", Msg: fmt.Sprintf(format, args...)}
}
