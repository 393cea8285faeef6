//go:build !amd64

package hashing

// hasCBORVector is false: cborTokensAsm is amd64 assembly.
const hasCBORVector = false

// cborTokens encodes toks with cborTokensWord when b has room for them plus cborSlack,
// and returns how many tokens and bytes it wrote (0, 0 without the room).
func cborTokens(b []byte, toks []int32) (int, int) {
	if len(b) < 5*len(toks)+cborSlack {
		return 0, 0
	}
	return len(toks), cborTokensWord(b, toks)
}
