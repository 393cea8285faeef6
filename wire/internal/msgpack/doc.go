// Package msgpack is the one msgpack reader under wire/: a zero-copy cursor (Reader) over
// a buffer, with one iterative skip and one str/bin reader that every msgpack format in
// wire/ (kvevent, httpapi) shares. It reads only what those decoders need, never
// allocates, and never recurses, so hostile nesting cannot grow the stack.
//
// Errors are sentinels: ErrTruncated and ErrInvalid mean the buffer is not well-formed
// msgpack at this point (nothing after can be located); ErrWrongType and ErrOutOfRange
// mean the value is intact but not what the caller asked for.
package msgpack
