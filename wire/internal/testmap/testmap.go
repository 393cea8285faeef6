// Package testmap holds the operations on the ordered maps that the wire packages' tests
// build msgpack maps from: entries keep the order they were written in and keys may
// repeat, which a Go map cannot express, so a test can send keys in any order and send
// one twice. Each package keeps its own entry type (what a value is, how it is encoded)
// and shares these operations. Only tests import it.
package testmap

// Entry is an ordered map's entry: Key returns its key.
type Entry[K comparable] interface {
	Key() K
}

// With returns a copy of m in which e's key holds e: the first entry with that key is
// replaced in place, or e is appended.
func With[M ~[]E, E Entry[K], K comparable](m M, e E) M {
	out := append(M(nil), m...)
	for i := range out {
		if out[i].Key() == e.Key() {
			out[i] = e
			return out
		}
	}
	return append(out, e)
}

// Without returns a copy of m without any entry of key k.
func Without[M ~[]E, E Entry[K], K comparable](m M, k K) M {
	var out M
	for _, e := range m {
		if e.Key() != k {
			out = append(out, e)
		}
	}
	return out
}

// Plus returns a copy of m with e appended, even if its key is already present (for
// duplicate-key tests).
func Plus[M ~[]E, E any](m M, e E) M {
	return append(append(M(nil), m...), e)
}
