// Package client is a small msgpack-over-HTTP client for the conductor's indexer API
// (/register, /unregister, /query, /global_view), written for benchmarks: a Client reuses
// its request, response and encode buffers, and decoding a query result into a reused
// Result allocates nothing once warmed up.
package client

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/tinylib/msgp/msgp"
	"github.com/valyala/fasthttp"
)

// Registration is one /register request.
type Registration struct {
	Endpoint, ReplayEndpoint string
	// Type is "vLLM", "SGLang" or "Mooncake".
	Type                string
	Model, Lora, Tenant string
	InstanceID          string
	BlockSize, DPRank   int
	Strategy, Algorithm string
	PythonHashSeed      string
	IndexProjection     string
}

// Query is one /query request. Empty optional strings are omitted from the body.
type Query struct {
	Model, Lora, Tenant, InstanceID, CacheSalt string
	BlockSize                                  int
	Tokens                                     []int32
	// BinaryTokens sends token_ids as a bin of little-endian int32 instead of an array.
	BinaryTokens bool
}

// Client talks to one conductor. It is not safe for concurrent use; give each goroutine
// its own (they may share nothing).
type Client struct {
	addr    string
	hc      *fasthttp.HostClient
	req     *fasthttp.Request
	resp    *fasthttp.Response
	buf     []byte
	timeout time.Duration
}

// New returns a client for the conductor at addr ("http://127.0.0.1:13333" or
// "127.0.0.1:13333"). timeout bounds each request; 0 means 30 s.
func New(addr string, timeout time.Duration) *Client {
	addr = strings.TrimPrefix(strings.TrimSuffix(addr, "/"), "http://")
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	return &Client{
		addr: addr,
		hc: &fasthttp.HostClient{
			Addr:                addr,
			MaxConns:            4,
			ReadTimeout:         timeout,
			WriteTimeout:        timeout,
			MaxResponseBodySize: 256 << 20,
		},
		req:     fasthttp.AcquireRequest(),
		resp:    fasthttp.AcquireResponse(),
		timeout: timeout,
	}
}

// Addr is the host:port the client talks to.
func (c *Client) Addr() string { return c.addr }

// Close releases the client's request and response and idle connections.
func (c *Client) Close() {
	c.hc.CloseIdleConnections()
	fasthttp.ReleaseRequest(c.req)
	fasthttp.ReleaseResponse(c.resp)
	c.req, c.resp = nil, nil
}

// StatusError is a non-200 answer; Message is the body's "error" field when present.
type StatusError struct {
	Path    string
	Status  int
	Message string
}

// Error formats the path, status and the server's message.
func (e *StatusError) Error() string {
	return fmt.Sprintf("%s: HTTP %d: %s", e.Path, e.Status, e.Message)
}

// do sends body (nil for GET) to path and returns the response body, valid until the
// next call.
func (c *Client) do(method, path string, body []byte) ([]byte, error) {
	c.req.Reset()
	c.req.Header.SetMethod(method)
	c.req.SetRequestURI(path)
	c.req.Header.SetHost(c.addr)
	if body != nil {
		c.req.Header.SetContentType("application/msgpack")
		c.req.SetBodyRaw(body)
	}
	c.resp.Reset()
	if err := c.hc.Do(c.req, c.resp); err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	if st := c.resp.StatusCode(); st != fasthttp.StatusOK {
		return nil, &StatusError{Path: path, Status: st, Message: errorMessage(c.resp.Body())}
	}
	return c.resp.Body(), nil
}

// errorMessage extracts {"error": msg} from an error body, or returns the raw bytes.
func errorMessage(b []byte) string {
	n, rest, err := msgp.ReadMapHeaderBytes(b)
	if err != nil {
		return string(b)
	}
	for i := uint32(0); i < n; i++ {
		var k, v []byte
		if k, rest, err = msgp.ReadMapKeyZC(rest); err != nil {
			break
		}
		if string(k) == "error" {
			if v, _, err = msgp.ReadStringZC(rest); err == nil {
				return string(v)
			}
			break
		}
		if rest, err = msgp.Skip(rest); err != nil {
			break
		}
	}
	return string(b)
}

// Register registers one publisher.
func (c *Client) Register(r *Registration) error {
	b := msgp.AppendMapHeader(c.buf[:0], 10)
	b = msgp.AppendString(b, "endpoint")
	b = msgp.AppendString(b, r.Endpoint)
	b = msgp.AppendString(b, "replay_endpoint")
	b = msgp.AppendString(b, r.ReplayEndpoint)
	b = msgp.AppendString(b, "type")
	b = msgp.AppendString(b, r.Type)
	b = msgp.AppendString(b, "modelname")
	b = msgp.AppendString(b, r.Model)
	b = msgp.AppendString(b, "lora_name")
	b = msgp.AppendString(b, r.Lora)
	b = msgp.AppendString(b, "tenant_id")
	b = msgp.AppendString(b, tenantOr(r.Tenant))
	b = msgp.AppendString(b, "instance_id")
	b = msgp.AppendString(b, r.InstanceID)
	b = msgp.AppendString(b, "block_size")
	b = msgp.AppendInt(b, r.BlockSize)
	b = msgp.AppendString(b, "dp_rank")
	b = msgp.AppendInt(b, r.DPRank)
	b = msgp.AppendString(b, "hash_profile")
	b = msgp.AppendMapHeader(b, 4)
	b = msgp.AppendString(b, "strategy")
	b = msgp.AppendString(b, r.Strategy)
	b = msgp.AppendString(b, "algorithm")
	b = msgp.AppendString(b, r.Algorithm)
	b = msgp.AppendString(b, "python_hash_seed")
	b = msgp.AppendString(b, r.PythonHashSeed)
	b = msgp.AppendString(b, "index_projection")
	b = msgp.AppendString(b, r.IndexProjection)
	c.buf = b
	if _, err := c.do("POST", "/register", b); err != nil {
		return fmt.Errorf("register %s rank %d: %w", r.InstanceID, r.DPRank, err)
	}
	return nil
}

// Unregister removes one publisher.
func (c *Client) Unregister(instanceID, tenant string, dpRank int) error {
	b := msgp.AppendMapHeader(c.buf[:0], 3)
	b = msgp.AppendString(b, "instance_id")
	b = msgp.AppendString(b, instanceID)
	b = msgp.AppendString(b, "tenant_id")
	b = msgp.AppendString(b, tenantOr(tenant))
	b = msgp.AppendString(b, "dp_rank")
	b = msgp.AppendInt(b, dpRank)
	c.buf = b
	if _, err := c.do("POST", "/unregister", b); err != nil {
		return fmt.Errorf("unregister %s rank %d: %w", instanceID, dpRank, err)
	}
	return nil
}

func tenantOr(t string) string {
	if t == "" {
		return "default"
	}
	return t
}

// AppendQuery appends the msgpack body of q to dst.
func AppendQuery(dst []byte, q *Query) []byte {
	n := uint32(3)
	for _, s := range [...]string{q.Lora, q.Tenant, q.InstanceID, q.CacheSalt} {
		if s != "" {
			n++
		}
	}
	b := msgp.AppendMapHeader(dst, n)
	b = msgp.AppendString(b, "model")
	b = msgp.AppendString(b, q.Model)
	b = msgp.AppendString(b, "block_size")
	b = msgp.AppendInt(b, q.BlockSize)
	if q.Lora != "" {
		b = msgp.AppendString(b, "lora_name")
		b = msgp.AppendString(b, q.Lora)
	}
	if q.Tenant != "" {
		b = msgp.AppendString(b, "tenant_id")
		b = msgp.AppendString(b, q.Tenant)
	}
	if q.InstanceID != "" {
		b = msgp.AppendString(b, "instance_id")
		b = msgp.AppendString(b, q.InstanceID)
	}
	if q.CacheSalt != "" {
		b = msgp.AppendString(b, "cache_salt")
		b = msgp.AppendString(b, q.CacheSalt)
	}
	b = msgp.AppendString(b, "token_ids")
	if q.BinaryTokens {
		b = msgp.AppendBytesHeader(b, uint32(4*len(q.Tokens)))
		for _, t := range q.Tokens {
			b = binary.LittleEndian.AppendUint32(b, uint32(t))
		}
		return b
	}
	b = msgp.AppendArrayHeader(b, uint32(len(q.Tokens)))
	for _, t := range q.Tokens {
		b = msgp.AppendInt32(b, t)
	}
	return b
}

// Query sends q and decodes the answer into res.
func (c *Client) Query(q *Query, res *Result) error {
	c.buf = AppendQuery(c.buf[:0], q)
	body, err := c.do("POST", "/query", c.buf)
	if err != nil {
		return err
	}
	if err := res.Decode(body); err != nil {
		return fmt.Errorf("decode /query answer: %w", err)
	}
	return nil
}

// QueryRaw sends a pre-encoded /query body (AppendQuery) and decodes the answer into
// res; load generators encode their prompts once and replay the bytes.
func (c *Client) QueryRaw(body []byte, res *Result) error {
	resp, err := c.do("POST", "/query", body)
	if err != nil {
		return err
	}
	if err := res.Decode(resp); err != nil {
		return fmt.Errorf("decode /query answer: %w", err)
	}
	return nil
}

// ErrNoContext means the context asked for is not in /global_view.
var ErrNoContext = errors.New("context not found in /global_view")

// PrefixCount returns prefix_count of the context (model, lora, tenant, blockSize) from
// /global_view.
func (c *Client) PrefixCount(model, lora, tenant string, blockSize int) (uint64, error) {
	body, err := c.do("GET", "/global_view", nil)
	if err != nil {
		return 0, err
	}
	n, found, err := findPrefixCount(body, model, lora, tenantOr(tenant), int64(blockSize))
	if err != nil {
		return 0, fmt.Errorf("decode /global_view: %w", err)
	}
	if !found {
		return 0, fmt.Errorf("%w: model %q lora %q tenant %q block_size %d", ErrNoContext, model, lora, tenant, blockSize)
	}
	return n, nil
}

func findPrefixCount(b []byte, model, lora, tenant string, bs int64) (uint64, bool, error) {
	n, b, err := msgp.ReadMapHeaderBytes(b)
	if err != nil {
		return 0, false, err
	}
	for i := uint32(0); i < n; i++ {
		var k []byte
		if k, b, err = msgp.ReadMapKeyZC(b); err != nil {
			return 0, false, err
		}
		if string(k) != "contexts" {
			if b, err = msgp.Skip(b); err != nil {
				return 0, false, err
			}
			continue
		}
		var nc uint32
		if nc, b, err = msgp.ReadArrayHeaderBytes(b); err != nil {
			return 0, false, err
		}
		for j := uint32(0); j < nc; j++ {
			var fields uint32
			if fields, b, err = msgp.ReadMapHeaderBytes(b); err != nil {
				return 0, false, err
			}
			var gotModel, gotLora, gotTenant []byte
			var gotBS int64
			var count uint64
			for f := uint32(0); f < fields; f++ {
				if k, b, err = msgp.ReadMapKeyZC(b); err != nil {
					return 0, false, err
				}
				switch string(k) {
				case "model_name":
					gotModel, b, err = msgp.ReadStringZC(b)
				case "lora_name":
					gotLora, b, err = msgp.ReadStringZC(b)
				case "tenant_id":
					gotTenant, b, err = msgp.ReadStringZC(b)
				case "block_size":
					gotBS, b, err = msgp.ReadInt64Bytes(b)
				case "prefix_count":
					count, b, err = msgp.ReadUint64Bytes(b)
				default:
					b, err = msgp.Skip(b)
				}
				if err != nil {
					return 0, false, fmt.Errorf("context %d field %q: %w", j, k, err)
				}
			}
			if string(gotModel) == model && string(gotLora) == lora && string(gotTenant) == tenant && gotBS == bs {
				return count, true, nil
			}
		}
		return 0, false, nil
	}
	return 0, false, nil
}
