package kvevent

// BufferCaps exposes the decoder's reusable buffer capacities to the external fuzz
// tests, which assert that a payload cannot make them grow past a small multiple
// of its own length.
func (d *Decoder) BufferCaps() (events, hashes, tokens, errs int) {
	return cap(d.events), cap(d.hashes), cap(d.tokens), cap(d.errs)
}

// WithoutVBMI returns d set to decode token arrays on the exact path alone, never
// through tokenarray.DecodeVBMI: the reference the tests hold the fast path to.
func (d *Decoder) WithoutVBMI() *Decoder {
	d.noVBMI = true
	return d
}
