package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/httpclient"
	"github.com/conductor-go/conductor/snapshot"
)

// snapshotPath is the conductor route (server.SnapshotPath).
const snapshotPath = "/cluster/snapshot"

// cmdSnapshot saves the index of a conductor to a file (GET /cluster/snapshot) or loads
// one into it (POST). The file is checked (version, checksum) before it is sent.
func (c *cli) cmdSnapshot(g *globals, args []string) int {
	fs := flag.NewFlagSet("snapshot", flag.ContinueOnError)
	file := fs.String("file", "", "snapshot file (\"-\": stdout for save, stdin for load)")
	replace := fs.Bool("replace", false, "load: swap the snapshot in over an index that holds data (else refused with 409)")
	if len(args) == 0 || (args[0] != "save" && args[0] != "load") {
		g.register(fs) // the usage lists the global flags too, as parseFlags' does
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			c.commandUsage(c.stdout, "snapshot", fs)
			return exitOK
		}
		return c.usageError("snapshot", fs, "want save or load")
	}
	op := args[0]
	if g.timeout == httpclient.DefaultTimeout {
		g.timeout = 10 * time.Minute // a large index takes a while to stream
	}
	if code := c.parseFlags("snapshot", fs, g, args[1:]); code >= 0 {
		return code
	}
	if *file == "" {
		return c.usageError("snapshot", fs, "--file is required")
	}
	cl, code := c.client(g)
	if code >= 0 {
		return code
	}
	url := cl.Addr() + snapshotPath
	cl.Close()
	ctx, cancel := context.WithTimeout(c.ctx, g.timeout)
	defer cancel()
	if op == "save" {
		return c.snapshotSave(ctx, g, url, *file)
	}
	return c.snapshotLoad(ctx, g, url, *file, *replace)
}

func (c *cli) snapshotSave(ctx context.Context, g *globals, url, file string) int {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return c.inputError(err)
	}
	resp, code := c.snapshotDo(g, req)
	if code >= 0 {
		return code
	}
	defer resp.Body.Close()
	var out io.Writer = c.stdout
	tmp := ""
	if file != "-" {
		f, err := os.CreateTemp(dirOf(file), ".snapshot-*")
		if err != nil {
			return c.inputError(err)
		}
		tmp = f.Name()
		defer os.Remove(tmp)
		defer f.Close()
		out = f
	}
	n, err := io.Copy(out, resp.Body)
	if err != nil {
		fmt.Fprintf(c.stderr, "error: snapshot stream cut after %d bytes: %v\n", n, err)
		return exitReply
	}
	if tmp != "" {
		// Check the whole file (checksum and structure: the signature is the loading
		// conductor's to check) before it replaces anything.
		f, err := os.Open(tmp)
		if err != nil {
			return c.inputError(err)
		}
		var st snapshot.Stats
		sp, verr := snapshot.OpenFile(f, snapshot.ReceiveOptions{MaxBytes: 1 << 40, Unauthenticated: true})
		if verr == nil {
			st, verr = sp.Read(nopSnap{})
		}
		_ = f.Close()
		if verr != nil {
			fmt.Fprintf(c.stderr, "error: the snapshot received does not verify: %v\n", verr)
			return exitReply
		}
		if err := os.Rename(tmp, file); err != nil {
			return c.inputError(err)
		}
		fmt.Fprintf(c.stderr, "saved %s: %d bytes, %d contexts, %d block entries, %d bindings\n", file, n, st.Contexts, st.Entries, st.Bindings)
	}
	return exitOK
}

func (c *cli) snapshotLoad(ctx context.Context, g *globals, url, file string, replace bool) int {
	// Checked (checksum and structure) before it is sent, and sent from disk: a file
	// from standard input is spooled to a temporary file first.
	var sp *snapshot.Spool
	var err error
	if file == "-" {
		sp, err = snapshot.Receive(c.stdin, snapshot.ReceiveOptions{MaxBytes: 1 << 40, Unauthenticated: true})
	} else {
		var f *os.File
		if f, err = os.Open(file); err == nil {
			if sp, err = snapshot.OpenFile(f, snapshot.ReceiveOptions{MaxBytes: 1 << 40, Unauthenticated: true}); err != nil {
				_ = f.Close()
			}
		}
	}
	if err == nil {
		_, err = sp.Read(nopSnap{})
		if err != nil {
			_ = sp.Close()
		}
	}
	if err != nil {
		return c.inputError(fmt.Errorf("%s: %w", file, err))
	}
	defer sp.Close()
	if replace {
		url += "?replace=true"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, sp.Reader())
	if err != nil {
		return c.inputError(err)
	}
	req.ContentLength = sp.Size()
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, code := c.snapshotDo(g, req)
	if code >= 0 {
		return code
	}
	defer resp.Body.Close()
	var res snapshotLoaded
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(&res); err != nil {
		fmt.Fprintf(c.stderr, "error: POST %s: unreadable answer: %v\n", snapshotPath, err)
		return exitReply
	}
	if g.json {
		return c.printJSON(res)
	}
	return c.printRows([2]string{"status", "loaded"}, [2]string{"bytes", itoa(res.Bytes)},
		[2]string{"contexts", itoa(res.Contexts)}, [2]string{"entries", itoa(res.Entries)},
		[2]string{"bindings", itoa(res.Bindings)}, [2]string{"applied", itoa(res.Applied)},
		[2]string{"skipped", itoa(res.Skipped)})
}

// snapshotLoaded is the conductor's answer to a snapshot load (POST /cluster/snapshot):
// what the file held, and how many of its block entries and bindings were applied or
// skipped (their slot or source is not registered on that conductor).
type snapshotLoaded struct {
	Bytes    int64 `json:"bytes"`
	Contexts int64 `json:"contexts"`
	Entries  int64 `json:"entries"`
	Bindings int64 `json:"bindings"`
	Applied  int64 `json:"applied"`
	Skipped  int64 `json:"skipped"`
}

// snapshotDo sends req with the admin token; a non-200 answer is reported (exit 1) and
// an unreachable conductor exits 2.
func (c *cli) snapshotDo(g *globals, req *http.Request) (*http.Response, int) {
	if g.token != "" {
		req.Header.Set("Authorization", "Bearer "+g.token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fmt.Fprintf(c.stderr, "error: cannot reach %s: %v\n", req.URL.Host, err)
		return nil, exitUsage
	}
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		_ = resp.Body.Close()
		fmt.Fprintf(c.stderr, "error: %s %s: %s: %s\n", req.Method, snapshotPath, resp.Status, strings.TrimSpace(string(body)))
		return nil, exitReply
	}
	return resp, -1
}

func dirOf(path string) string {
	if i := strings.LastIndexByte(path, '/'); i >= 0 {
		return path[:i+1]
	}
	return "."
}

type nopSnap struct{}

func (nopSnap) Context(*snapshot.Header) error { return nil }
func (nopSnap) Chunk(*snapshot.Header, *engine.SnapshotChunk) error {
	return nil
}
