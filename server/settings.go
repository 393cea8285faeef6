package server

import (
	"encoding/json"
	"fmt"
	"math"
	"net/url"
	"path/filepath"
	"time"

	"github.com/conductor-go/conductor/cluster"
	"github.com/conductor-go/conductor/hashing"
	"github.com/conductor-go/conductor/ingest"
	"github.com/conductor-go/conductor/ingest/translate"
	"github.com/conductor-go/conductor/ingest/zmqtransport"
	"github.com/conductor-go/conductor/internal/accesslog"
	"github.com/conductor-go/conductor/internal/jsonval"
	"github.com/conductor-go/conductor/internal/lograte"
	"github.com/conductor-go/conductor/internal/pulse"
	"github.com/conductor-go/conductor/server/internal/limits"
	"github.com/conductor-go/conductor/service"
	"github.com/conductor-go/conductor/snapshot"
)

// maxMemoEntries caps query_memo_entries (20 GiB of memo at 20 bytes a block).
const maxMemoEntries = 1 << 30

// maxLimit bounds the byte, connection and service limits: anything larger is a typo.
const maxLimit = 1 << 40

// fileSettings is the table of the configuration file's keys, in the order they are
// applied and documented.
func fileSettings() []setting[FileConfig] {
	ms := func(set func(*FileConfig, time.Duration)) func(*FileConfig, int64) {
		return func(f *FileConfig, v int64) { set(f, time.Duration(v)*time.Millisecond) }
	}
	return []setting[FileConfig]{
		intSetting("http_server_port", DefaultHTTPPort, 0, 65535,
			"HTTP port (0 binds a free port and logs it)",
			func(f *FileConfig, v int64) { f.HTTPPort = int(v) }),
		intSetting("rpc_server_port", DefaultRPCPort, 0, 65535,
			"RPC port for the Python client; 0 disables RPC",
			func(f *FileConfig, v int64) { f.RPCPort = int(v) }),
		{key: "state_file", typ: "string", def: "`conductor_state.json` beside the config file",
			bounds: "a path (a relative one is taken from the config file's directory); `\"\"` disables",
			doc: "services registered over HTTP/RPC are kept here and registered again at start. An append-only log " +
				"(one fsynced line per change, compacted in the background), so a change costs the same however many " +
				"services exist. A registration that cannot be written is answered 500 and undone",
			init: func(f *FileConfig) { f.StateFile = filepath.Join(filepath.Dir(f.Path), service.StateFileName) },
			parse: func(f *FileConfig, raw json.RawMessage) error {
				v, ok := jsonval.String(raw)
				if !ok {
					return fmt.Errorf("state_file must be a string")
				}
				f.StateFile = f.besideConfig(v)
				return nil
			}},
		stringSetting("http_bind_address", "", "an interface address; `\"\"` all interfaces",
			"interface the HTTP server listens on, e.g. `127.0.0.1`", nil,
			func(f *FileConfig, v string) { f.HTTPBindAddress = v }),
		stringSetting("rpc_bind_address", "", "an interface address; `\"\"` all interfaces",
			"interface the RPC server listens on", nil,
			func(f *FileConfig, v string) { f.RPCBindAddress = v }),
		stringSetting("admin_token", "", "a string without control bytes; `\"\"` no token",
			"when set, `POST /register` and `/unregister` (every route that changes state) need "+
				"`Authorization: Bearer <token>` (else 401); `/query` and the read-only routes stay open. A token with "+
				"a control byte (a newline pasted with it) is refused at start: no HTTP header could carry it",
			checkToken,
			func(f *FileConfig, v string) { f.AdminToken = v }),
		{key: "rpc_allow_mutations", typ: "boolean", def: "unset", bounds: "true, false",
			doc: "whether RPC `Register` and `Unregister` are served. The RPC wire (coro_rpc, the upstream Python " +
				"client's) has no field for a token, so unset means: served without `admin_token`, refused with it " +
				"(`CONDUCTOR_UNAVAILABLE`, logged and counted under `conductor_rpc_requests_total`); `true` serves " +
				"them anyway, `false` never. Queries and the read-only calls are always served. Unset with RPC on a " +
				"non-loopback address and no token logs a warning at start",
			parse: func(f *FileConfig, raw json.RawMessage) error {
				var v bool
				switch string(raw) {
				case "true":
					v = true
				case "false":
				default:
					return fmt.Errorf("rpc_allow_mutations must be true or false")
				}
				f.RPCAllowMutations = &v
				return nil
			}},
		intSetting("max_query_body_bytes", limits.DefaultMaxQueryBodyBytes, 1, maxLimit,
			"largest `/query` body (16M tokens as an int32 bin); larger is answered 413 without reading it",
			func(f *FileConfig, v int64) { f.Limits.MaxQueryBodyBytes = int(v) }),
		intSetting("max_admin_body_bytes", limits.DefaultMaxAdminBodyBytes, 1, maxLimit,
			"largest `/register` / `/unregister` body (413 above)",
			func(f *FileConfig, v int64) { f.Limits.MaxAdminBodyBytes = int(v) }),
		intSetting("max_inflight_body_bytes", limits.DefaultMaxInflightBodyBytes, 1, maxLimit,
			"request-body bytes held at once by all HTTP and RPC requests together (a query body counts with what "+
				"it decodes to: 5× its size on `/query`, where a one-byte id becomes a 4-byte token, 9× on "+
				"`/query_by_hash` (8-byte keys), 2× over RPC). An HTTP body that does not fit is answered 503 with "+
				"`Retry-After: 1` before it is read; an RPC frame waits unread (TCP backpressure) until it fits or "+
				"`rpc_read_timeout_ms` passes; bodies over 1 MiB may use only 7/8 of it, so small queries always get through",
			func(f *FileConfig, v int64) { f.Limits.MaxInflightBodyBytes = v }),
		intSetting("http_max_connections", limits.DefaultHTTPMaxConnections, 1, maxLimit,
			"HTTP connections served at once; beyond it 503 and close",
			func(f *FileConfig, v int64) { f.Limits.HTTPMaxConnections = int(v) }),
		intSetting("http_read_buffer_bytes", limits.DefaultHTTPReadBufferBytes, limits.MinHTTPReadBufferBytes, limits.MaxHTTPReadBufferBytes,
			"each HTTP connection's read buffer; it also bounds a request's header (431 above it). Each open "+
				"connection holds one. Larger reads a request whose header and body fit in one system call, but then "+
				"copies the body out of the buffer once more: on 8K binary-token queries sent in one write, 64 KiB cost 7% "+
				"more server CPU",
			func(f *FileConfig, v int64) { f.Limits.HTTPReadBufferBytes = int(v) }),
		intSetting("http_write_buffer_bytes", limits.DefaultHTTPWriteBufferBytes, limits.MinHTTPWriteBufferBytes, limits.MaxHTTPWriteBufferBytes,
			"each HTTP connection's write buffer, held by an open connection once it has answered. A response "+
				"larger than it leaves in two writes and wakes the client twice; /query answers pass 4 KiB at "+
				"25-30 instances of one DP rank, 7-9 of eight (with 64 instances, 16 KiB took 2-4% off an 8K query's server CPU)",
			func(f *FileConfig, v int64) { f.Limits.HTTPWriteBufferBytes = int(v) }),
		intSetting("http_read_timeout_ms", limits.DefaultHTTPReadTimeout.Milliseconds(), 1, maxLimit,
			"time to read one HTTP request (headers and body)",
			ms(func(f *FileConfig, d time.Duration) { f.Limits.HTTPReadTimeout = d })),
		intSetting("http_idle_timeout_ms", limits.DefaultHTTPIdleTimeout.Milliseconds(), 1, maxLimit,
			"an idle keep-alive HTTP connection is closed after this",
			ms(func(f *FileConfig, d time.Duration) { f.Limits.HTTPIdleTimeout = d })),
		intSetting("rpc_max_connections", limits.DefaultRPCMaxConnections, 1, maxLimit,
			"RPC connections open at once; more are closed at accept",
			func(f *FileConfig, v int64) { f.Limits.RPCMaxConnections = int(v) }),
		intSetting("rpc_read_timeout_ms", limits.DefaultRPCReadTimeout.Milliseconds(), 1, maxLimit,
			"time to read one RPC frame once its first byte arrived",
			ms(func(f *FileConfig, d time.Duration) { f.Limits.RPCReadTimeout = d })),
		intSetting("rpc_idle_timeout_ms", limits.DefaultRPCIdleTimeout.Milliseconds(), 1, maxLimit,
			"an RPC connection with no request for this long is closed (the Python client reconnects on its next call)",
			ms(func(f *FileConfig, d time.Duration) { f.Limits.RPCIdleTimeout = d })),
		intSetting("max_services", service.DefaultMaxServices, 1, maxLimit,
			"registered services, static ones included (each holds a few file descriptors); more are refused with "+
				"`invalid_registration`",
			func(f *FileConfig, v int64) { f.Limits.MaxServices = int(v) }),
		intSetting("max_registration_field_bytes", service.DefaultMaxFieldBytes, 1, maxLimit,
			"longest string field of a registration over HTTP/RPC (`invalid_value` with the field above)",
			func(f *FileConfig, v int64) { f.Limits.MaxFieldBytes = int(v) }),
		intSetting("shutdown_timeout_ms", limits.DefaultShutdownTimeout.Milliseconds(), 1, maxLimit,
			"on SIGTERM/SIGINT, in-flight requests get this long; connections still open (idle or half-sent) are then closed",
			ms(func(f *FileConfig, d time.Duration) { f.Limits.ShutdownTimeout = d })),
		stringSetting("access_log", "", "a file path (a relative one is taken from the config file's directory), "+
			"`\"-\"` standard output, `\"\"` off",
			"file that gets one JSON line per contract HTTP request: `time`, `route`, and for `/query` and "+
				"`/query_by_hash` `model`, `tokens`, `blocks_hashed`, `matched`; then `latency_us`, `status`, `trace_id`. "+
				"RPC `Query` calls get the same line with `function` instead of `route`, the RPC code (0 = OK) as "+
				"`status` and no trace id. Lines are buffered in memory (no allocation or I/O on the request path) and "+
				"written by a background goroutine", nil,
			func(f *FileConfig, v string) {
				if v != "-" {
					v = f.besideConfig(v)
				}
				f.AccessLog.Path = v
			}),
		stringSetting("access_log_trace_header", accesslog.DefaultTraceHeader, "a header name",
			"request header logged as `trace_id` (first 128 bytes, JSON-escaped)", nil,
			func(f *FileConfig, v string) { f.AccessLog.TraceHeader = v }),
		intSetting("access_log_buffer_bytes", accesslog.DefaultBufferBytes, 4096, 1<<30,
			"bound on buffered lines; when the writer falls behind, lines are dropped and counted in "+
				"`conductor_access_log_dropped_lines_total`",
			func(f *FileConfig, v int64) { f.AccessLog.BufferBytes = int(v) }),
		intSetting("access_log_flush_interval_ms", accesslog.DefaultFlush.Milliseconds(), 1, 60000,
			"how long after its first line the buffer is written (at once when half full); while no request is "+
				"logged nothing runs",
			ms(func(f *FileConfig, d time.Duration) { f.AccessLog.FlushInterval = d })),
		intSetting("query_memo_entries", hashing.DefaultMemoEntries, 0, maxMemoEntries,
			"most blocks the query key memo remembers, in runs of 8 consecutive blocks of a prompt (160 bytes a run, "+
				"20 a block: 160 MiB at the default once grown to it and filled): a prompt prefix asked again skips "+
				"SHA-256 for its remembered runs (a prompt's last, partial run is hashed each time), and its walk reads "+
				"each block's record where the last walk found it instead of probing the index table (a record hint, "+
				"checked before use); answers never change; 0 disables. The memo starts at 131,072 blocks with "+
				"nothing resident, and grows in the background: once queries hash blocks, ahead of the index (one memo "+
				"block per four indexed blocks, populated before queries use it), and when queries have filled half "+
				"of it and prompts come back after it evicted their runs (doubling, up to two memo blocks per indexed "+
				"block; prompts that are all new do not grow it); never past this bound (logged as `query "+
				"key memo grew`); a bound of 131,072 or less is the memo's size from the start. Metrics "+
				"`conductor_query_memo_{hits,misses,evictions,reasked}_total`, `conductor_query_memo_capacity_entries` (its "+
				"current size). A bound whose memo would take more than a quarter of the memory the process may use "+
				"(the machine's, or its control group's limit when lower) is refused at start with the size it "+
				"would take",
			func(f *FileConfig, v int64) { f.MemoEntries = int(v) }).also(checkMemoFits),
		boolSetting("query_memo_populate", true,
			"make each part of the memo resident before queries use it (`madvise(MADV_POPULATE_WRITE)`, Linux 5.14+): "+
				"a background goroutine populates each growth step, a huge page at a time, before the memo takes it "+
				"(a memo of fixed size is populated at start, and the time it took logged), so that no query pays the "+
				"page faults of the memo's first writes (cold queries otherwise pay a zeroed huge page for each first "+
				"write to one); `false` lets pages become resident as queries fill them; where populating is not "+
				"possible the conductor logs why and goes on",
			func(f *FileConfig, v bool) { f.PopulateMemo = v }),
		boolSetting("query_memo_second_sight", true,
			"remember a prompt in the memo from the second time its first run (8 blocks) is asked, not the first: "+
				"a prompt asked once, as most prompts are, is hashed as without a memo (its first run looked up and "+
				"noted in a 1-bit-per-entry doorkeeper, no other lookups, lanes or inserts), which spares it about a "+
				"fifth of its CPU; the second ask remembers it, the third is served from the memo. Prompts that share "+
				"a first run (a system prompt, a conversation's earlier turns) are remembered from their first ask. "+
				"`false`: every prompt is remembered from its first ask",
			func(f *FileConfig, v bool) { f.MemoSecondSight = v }),
		intSetting("query_pulse_ms", pulse.DefaultInterval.Milliseconds(), 0, 1000,
			"while HTTP or RPC queries arrive, a timer fires this often, and stops a second after the last "+
				"query (an idle conductor has no wake-ups). It keeps the Go runtime's threads taking turns at the "+
				"network poller, which on a VM whose CPUs halt when idle halved the p50 of a lone client's 8K "+
				"queries and cut their server CPU by about 12% with token arrays (docs/operations.md). Periods "+
				"of 10 to 50 ms measured alike, shorter ones worse (2 ms: +30% CPU). `0`: no timer",
			func(f *FileConfig, v int64) { f.QueryPulseMS = v }),
		intSetting("max_blocks", 0, 0, math.MaxInt32,
			"most blocks indexed over all contexts together (each Mooncake object binding counts as one more); past "+
				"it every new block evicts the oldest-written block of the whole index (counted in "+
				"`conductor_context_evicted_blocks_total`, logged as a warning at most every 10 s per context). Each "+
				"context is also bounded at 10,000,000 blocks",
			func(f *FileConfig, v int64) { f.MaxBlocks = int(v) }).shown("0 (no bound)"),
		intSetting("memory_limit_bytes", 0, 0, math.MaxInt64,
			"memory the index's blocks and Mooncake object bindings may be charged over all contexts together: 48 "+
				"bytes a block in contexts of up to 21 slots (its 32-byte record and its share of the hash table), 64 "+
				"up to 64 slots, 88 up to 128; 40 bytes a binding whose object key is 64 lowercase hex digits whose "+
				"first 16 are its block hash (SGLang HiCache keys: neither the hash nor those 16 digits are stored "+
				"again); 48 plus 16 and the key's length for any other binding (its key kept as a string, in a second "+
				"index); plus 16 and its length for each component of a binding whose set of components is not "+
				"interned (a context's bindings share up to 8,190 sets over up to 64 component names at once). Past "+
				"it every new block or binding evicts the oldest-written block of the whole index (up to two per "+
				"insertion while over; counted in `conductor_context_evicted_blocks_total`, logged as a warning at "+
				"most every 10 s per context). Process RSS is higher: the Go runtime, buffers, connections and the "+
				"slack of hash tables between growth steps come on top, and so does the query key memo (20 bytes a "+
				"block of its current size, `conductor_query_memo_capacity_entries`: 5 to 40 bytes an indexed block "+
				"once queries use it, at most 160 MiB by default, see `query_memo_entries`)",
			func(f *FileConfig, v int64) { f.MemoryLimitBytes = v }).shown("0 (no bound)"),
		intSetting("zmq_max_message_size", ingest.DefaultMaxMessageSize, -1, maxLimit,
			"bytes one frame of a ZMQ message may have (a batch's payload; its topic and sequence frames are a few "+
				"bytes), on the SUB and replay sockets (libzmq `ZMQ_MAXMSGSIZE`, which libzmq applies per frame); "+
				"-1 unlimited. libzmq refuses a bigger one before allocating it and drops the connection; the "+
				"conductor counts it (`ProtocolErrors`), reconnects and recovers the lost batch through replay, or "+
				"marks the source stale",
			func(f *FileConfig, v int64) { f.ZMQMaxMessageSize = v }),
		intSetting("zmq_source_buffer_bytes", ingest.DefaultBufferBytes, 1, maxLimit,
			"bytes of messages libzmq may hold for one subscription before the conductor reads them (a burst "+
				"arriving faster than it is applied). libzmq counts messages, so its receive high-water mark "+
				"(`ZMQ_RCVHWM`) is this divided by `zmq_max_message_size` (at least 1, at most 200,000; 64 with the "+
				"defaults); with `zmq_max_message_size` -1 it is divided by 8 MiB and holds only for messages no "+
				"larger. Past it libzmq stops reading the connection and the rest of the burst waits in TCP buffers "+
				"and the publisher's own queue (vLLM's holds 100,000 batches); what overflows that is dropped by the "+
				"publisher and shows as a sequence gap, recovered through replay (a source without replay goes stale)",
			func(f *FileConfig, v int64) { f.ZMQSourceBufferBytes = v }),
		intSetting("zmq_io_threads", 1, 0, 64,
			"libzmq I/O threads of the one ZMQ context all subscriptions share (0: 1)",
			func(f *FileConfig, v int64) { f.ZMQIOThreads = int(v) }),
		intSetting("zmq_reconnect_max_ms", zmqtransport.DefaultReconnectIntervalMax.Milliseconds(), 100, 600_000,
			"a subscription whose publisher is not there (down, restarting, a wrong address) retries after 100 ms, "+
				"then after twice the last pause, up to this (libzmq `ZMQ_RECONNECT_IVL_MAX`), so a thousand dead "+
				"endpoints cost a few hundred connection attempts a second rather than ten thousand. A publisher that "+
				"comes back is connected within this long; what it published meanwhile comes back through its replay "+
				"endpoint",
			func(f *FileConfig, v int64) { f.ZMQReconnectMaxMS = int(v) }),
		intSetting("zmq_join_check_delay_ms", ingest.DefaultJoinCheckDelay.Milliseconds(), -1, 3_600_000,
			"milliseconds after a subscription with a `replay_endpoint` first connects before its join check asks "+
				"the replay endpoint for everything after the last applied batch (batches published after the "+
				"catch-up read the publisher's buffer but before the subscription took effect), unless a live batch "+
				"arrived first (its sequence number shows any gap); -1 turns the check off",
			func(f *FileConfig, v int64) { f.ZMQJoinCheckDelayMS = int(v) }),
		intSetting("ingest_log_burst", lograte.DefaultBurst, -1, 1<<20,
			"per subscription and kind of log line (level and message), lines written per interval; the rest are "+
				"counted and reported as `suppressed` on the next line of the kind (and when the service stops); -1 "+
				"unlimited. Counters and metrics keep exact numbers",
			func(f *FileConfig, v int64) { f.IngestLogBurst = int(v) }),
		intSetting("ingest_log_interval_seconds", int64(lograte.DefaultInterval/time.Second), 0, 86400,
			"the interval of `ingest_log_burst` (0: the default)",
			func(f *FileConfig, v int64) { f.IngestLogIntervalSeconds = int(v) }),
		intSetting("max_snapshot_bytes", snapshot.DefaultMaxBytes, 1<<20, maxLimit,
			"largest snapshot `POST /cluster/snapshot` or a bootstrapping replica accepts (413 above it; a "+
				"`Content-Length` over it is refused before the body is read). The stream is written to a "+
				"temporary file in `$TMPDIR` (removed at once, so nothing is left behind) while its checksum and "+
				"signature are checked, then read back a frame at a time: memory stays bounded, the disk holds up "+
				"to this much per load in progress (two at most)",
			func(f *FileConfig, v int64) { f.MaxSnapshotBytes = v }),
		intSetting("max_snapshot_downloads", DefaultMaxSnapshotDownloads, 1, 1024,
			"snapshots `GET /cluster/snapshot` streams at once (503 with `Retry-After` beyond it). Each keeps its "+
				"own journal of the changes between its steps (up to 4M block hashes a context)",
			func(f *FileConfig, v int64) { f.MaxSnapshotDownloads = int(v) }),
		boolSetting("hash_check", true,
			"verify each engine service's hash profile against the block hashes its engine publishes: every "+
				"`BlockStored` until 64 events were verified, then one batch in 128 (+2.4% ingest CPU per block measured, "+
				"docs/performance.md). A mismatch is counted (`conductor_service_hash_mismatch_total`), logged with the "+
				"profile that would reproduce the engine's hashes, and shown as `HashCheck` in `/services`; blocks are "+
				"indexed by the engine's hashes either way. `false`: no check (`HashCheck` reads `off`)",
			func(f *FileConfig, v bool) { f.HashCheck = v }),
		intSetting("hash_check_log_interval_seconds", int64(translate.DefaultCheckLogInterval/time.Second), 1, 86400,
			"least time between two mismatch warnings of one context",
			func(f *FileConfig, v int64) { f.HashCheckLogIntervalSeconds = int(v) }),
		objectSetting("cluster", "object", "unset (one node, `state_file`)", "the `cluster.*` keys below; null: unset",
			"run as one replica of a cluster whose registrations live in etcd; with `cluster` set, `state_file` is not used",
			parseCluster),
		objectSetting("services", "any", "unset", "ignored",
			"accepted and ignored, as upstream does (its own tests write it)",
			func(*FileConfig, json.RawMessage) error { return nil }),
		objectSetting("kvevent_instance", "object", "`{}`", "entry name → registration",
			"services registered at start (`name: {endpoint, type, modelname, ...}`, the fields of `POST /register`; "+
				"the name is the `instance_id` when the entry has none); an invalid entry is logged and skipped",
			parseServices),
	}
}

// clusterSettings is the table of the "cluster" object's keys.
func clusterSettings() []setting[cluster.Config] {
	return []setting[cluster.Config]{
		objectSetting("etcd_endpoints", "array of strings", "required", "at least one `http(s)://host:port` URL",
			"the etcd cluster that holds the registrations",
			func(c *cluster.Config, raw json.RawMessage) error {
				var eps []string
				if err := json.Unmarshal(raw, &eps); err != nil {
					return fmt.Errorf("etcd_endpoints must be an array of strings")
				}
				for _, ep := range eps {
					u, err := url.Parse(ep)
					if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
						return fmt.Errorf("etcd_endpoints: %q is not an http(s)://host:port URL", ep)
					}
				}
				c.Endpoints = eps
				return nil
			}),
		stringSetting("key_prefix", cluster.DefaultKeyPrefix, "starts with `/`",
			"the root of every registry key in etcd",
			func(v string) string {
				if v == "" || v[0] != '/' {
					return "must start with /"
				}
				return ""
			},
			func(c *cluster.Config, v string) { c.KeyPrefix = v }),
		stringSetting("advertise_url", "", "a URL with a host; `\"\"` none",
			"this replica's HTTP URL, published under `members/` with a 10 s lease (peers load its snapshot from there)",
			func(v string) string {
				if u, err := url.Parse(v); v != "" && (err != nil || u.Host == "") {
					return fmt.Sprintf("%q is not a URL", v)
				}
				return ""
			},
			func(c *cluster.Config, v string) { c.AdvertiseURL = v }),
		intSetting("dial_timeout_ms", cluster.DefaultDialTimeout.Milliseconds(), 1, 600_000,
			"bounds connecting to etcd and each registry request",
			func(c *cluster.Config, v int64) { c.DialTimeout = time.Duration(v) * time.Millisecond }),
	}
}
