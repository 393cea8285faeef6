// Package replay replays a Mooncake request trace against a simulated engine fleet: a
// router loop asks the conductor which instance caches the longest prefix of each prompt,
// sends the request there, and the chosen engine caches the prompt and publishes its KV
// events. The same trace is also routed randomly, round-robin and by an oracle that reads
// the simulated caches directly, so the conductor's routing hit rate can be compared
// with the alternatives for the same fleet.
package replay

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/conductor-go/conductor/bench/sim"
)

// Request is one trace line.
type Request struct {
	// TimestampMs is the arrival time in milliseconds from the trace start.
	TimestampMs int64 `json:"timestamp"`
	// InputLength and OutputLength are the prompt and completion lengths in tokens.
	InputLength  int `json:"input_length"`
	OutputLength int `json:"output_length"`
	// HashIDs are the prompt's 512-token blocks; shared prefixes share leading ids.
	HashIDs []uint32 `json:"hash_ids"`
}

// LoadTrace reads a JSON-lines trace; max > 0 keeps only the first max requests.
func LoadTrace(r io.Reader, max int) ([]Request, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	var out []Request
	line := 0
	for sc.Scan() {
		line++
		if len(sc.Bytes()) == 0 {
			continue
		}
		var q Request
		if err := json.Unmarshal(sc.Bytes(), &q); err != nil {
			return nil, fmt.Errorf("trace line %d: %w", line, err)
		}
		if q.InputLength < 0 || q.InputLength > len(q.HashIDs)*sim.TokensPerHashID {
			return nil, fmt.Errorf("trace line %d: input_length %d does not fit %d hash ids", line, q.InputLength, len(q.HashIDs))
		}
		out = append(out, q)
		if max > 0 && len(out) >= max {
			break
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read trace: %w", err)
	}
	return out, nil
}

// LoadTraceFile reads a trace file (see LoadTrace).
func LoadTraceFile(path string, max int) ([]Request, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open trace: %w", err)
	}
	defer f.Close()
	reqs, err := LoadTrace(f, max)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return reqs, nil
}
