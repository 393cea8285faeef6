package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/conductor-go/conductor/cluster"
	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/hashing"
	"github.com/conductor-go/conductor/ingest/source"
	"github.com/conductor-go/conductor/ingest/zmqtransport"
	"github.com/conductor-go/conductor/internal/accesslog"
	"github.com/conductor-go/conductor/internal/deferred"
	"github.com/conductor-go/conductor/internal/pulse"
	"github.com/conductor-go/conductor/server/httpserver"
	"github.com/conductor-go/conductor/server/internal/limits"
	"github.com/conductor-go/conductor/server/rpcserver"
	"github.com/conductor-go/conductor/service"
	"github.com/conductor-go/conductor/snapshot"
)

// Limits bounds what clients can make the process hold (the limit keys of the config
// file); a zero field takes its default.
type Limits = limits.Config

// AppConfig configures a whole conductor process.
type AppConfig struct {
	// HTTPPort is the HTTP port; 0 binds a free port (logged).
	HTTPPort int
	// RPCPort is the RPC port; 0 binds a free port, negative disables RPC. (In the config
	// file, rpc_server_port 0 disables RPC: see FileConfig.AppConfig.)
	RPCPort int
	// Services are registered at start; a failing one is logged and skipped.
	Services []service.Config
	// SkippedServices counts invalid config entries, for the startup summary.
	SkippedServices int
	// ConfigPath is logged in the startup summary.
	ConfigPath string
	// StateFile is where services registered over HTTP/RPC are persisted and restored
	// from at start ("" disables).
	StateFile string
	Logger    *slog.Logger
	// BindAddress is the interface both listeners bind ("" = all interfaces, as
	// upstream); HTTPBindAddress and RPCBindAddress, when set, override it per listener.
	BindAddress     string
	HTTPBindAddress string
	RPCBindAddress  string
	// Limits bound bodies, connections, timeouts, services (zero fields: defaults).
	Limits Limits
	// AdminToken, when set, is required as "Authorization: Bearer <token>" on the HTTP
	// routes that change state. The RPC wire carries no token: with one set, RPC
	// Register and Unregister are refused unless RPCAllowMutations says otherwise.
	AdminToken string
	// RPCAllowMutations decides whether RPC Register and Unregister are served: nil
	// (the key unset) serves them only without an AdminToken; true always, false never.
	RPCAllowMutations *bool
	// Engine options (zero values take the engine defaults).
	MaxBlocksPerContext int
	// MemoEntries sizes the query key memo: 0 means hashing.DefaultMemoEntries, negative
	// disables it.
	MemoEntries int
	// PopulateMemo makes each part of the memo resident before queries use it (the
	// "query_memo_populate" key; see engine.Config.PopulateMemo).
	PopulateMemo bool
	// MemoSecondSight makes the memo remember a prompt from the second time its first
	// run is asked (the "query_memo_second_sight" key; see engine.Config.MemoSecondSight).
	MemoSecondSight bool
	// QueryPulse is the period of the timer kept firing while queries arrive, and
	// stopped a second after the last (the "query_pulse_ms" key; package
	// internal/pulse); 0 means none.
	QueryPulse time.Duration
	// MaxBlocks bounds the indexed blocks of all contexts together (the "max_blocks"
	// config key); 0 means no engine-wide bound. See engine.Config.MaxBlocks.
	MaxBlocks int
	// MemoryLimitBytes bounds the memory charged for the index's blocks and shared
	// bindings (the "memory_limit_bytes" config key); 0 means no bound. See
	// engine.Config.MemoryLimitBytes.
	MemoryLimitBytes int64
	// Extra HTTP routes, served beside /metrics, /healthz and /readyz.
	ExtraRoutes map[string]fasthttp.RequestHandler
	// DisableMetrics turns off /metrics and every metric update (for measuring their cost).
	DisableMetrics bool
	// AccessLog configures the HTTP access log (off unless AccessLog.Path is set).
	AccessLog accesslog.Config
	// ZMQMaxMessageSize bounds one ZMQ message on every subscription (0: 8 MiB, -1: none).
	ZMQMaxMessageSize int64
	// ZMQSourceBufferBytes bounds the bytes libzmq may queue for one subscription (0:
	// 512 MiB; see ingest.SubscriberConfig.BufferBytes).
	ZMQSourceBufferBytes int64
	// ZMQIOThreads is the libzmq I/O thread count of the shared context (0: 1).
	ZMQIOThreads int
	// ZMQReconnectMax bounds the doubling pause between a subscription's attempts to
	// reach a publisher that is not there (0: zmqtransport.DefaultReconnectIntervalMax).
	ZMQReconnectMax time.Duration
	// ZMQJoinCheckDelay is how long after a subscription first connects its join check
	// asks the replay endpoint for what the catch-up could not see (0: 1 s; negative:
	// none; see ingest.SubscriberConfig.JoinCheckDelay).
	ZMQJoinCheckDelay time.Duration
	// IngestLogBurst and IngestLogInterval rate-limit each subscription's repeated log
	// lines (0: 10 lines per 10 s per kind; burst -1: unlimited).
	IngestLogBurst    int
	IngestLogInterval time.Duration
	// HashCheckOff turns the profile self-check of engine sources off ("hash_check":
	// false); HashCheckLogInterval spaces a context's mismatch warnings (0: 1 minute).
	HashCheckOff         bool
	HashCheckLogInterval time.Duration
	// Cluster, when set, keeps the services registered over HTTP/RPC in an etcd registry
	// shared by every replica (StateFile is then not used); nil: a single node.
	Cluster *cluster.Config
	// MaxSnapshotBytes bounds a snapshot received by POST or at bootstrap (0:
	// snapshot.DefaultMaxBytes); it is held in a temporary file, not in memory.
	MaxSnapshotBytes int64
	// MaxSnapshotDownloads bounds the snapshots streamed at once (0:
	// DefaultMaxSnapshotDownloads).
	MaxSnapshotDownloads int
	// ClusterTestHook, in tests, is called at bootstrap stages ("subscribed": the
	// registry is loaded and its sources buffer; "loaded": the peer snapshot is loaded,
	// the buffers not yet applied).
	ClusterTestHook func(stage string)
	// PoisonReleasedBodies, in tests, zeroes each HTTP body buffer as it goes back to its
	// pool (httpserver.Options.PoisonReleasedBodies).
	PoisonReleasedBodies bool
}

// App is a running conductor: engine, service layer, HTTP and RPC listeners.
type App struct {
	log     *slog.Logger
	Engine  *engine.Engine
	Service *service.Service
	HTTP    *httpserver.Server
	RPC     *rpcserver.Server
	// Metrics is nil when disabled.
	Metrics *Metrics
	// AccessLog is nil when disabled.
	AccessLog *accesslog.Log
	// Counters count what the limits turned away (exported by /metrics).
	Counters *limits.Counters
	// pulse keeps a timer firing while queries arrive (nil: query_pulse_ms 0).
	pulse *pulse.Pulse
	// HTTPAddr and RPCAddr are the bound addresses (RPCAddr empty when RPC is disabled).
	HTTPAddr string
	RPCAddr  string

	ready atomic.Bool
	// release runs releaseMemory after large request bodies were served.
	release *deferred.Runner
	state   *service.StateFile // nil when persistence is off
	// zmq is the one ZMQ context of every subscription (nil in a build without cgo).
	zmq *zmqtransport.Transport

	stopOnce sync.Once
	wg       sync.WaitGroup
	// snapshotLoading admits one snapshot apply (stage and swap) at a time; receiving
	// and verifying a stream does not hold it.
	snapshotLoading sync.Mutex
	// snapshotReceipts and snapshotDownloads bound the snapshot POSTs receiving their
	// body and the GETs streaming one at once.
	snapshotReceipts, snapshotDownloads chan struct{}
	// maxSnapshotBytes bounds a received snapshot (max_snapshot_bytes).
	maxSnapshotBytes int64
	// snapshotsFailed counts snapshot streams aborted after their header was sent.
	snapshotsFailed atomic.Uint64
	// snapshotWriteHook, in tests, runs before each write of a snapshot stream.
	snapshotWriteHook func()

	// Cluster membership (nil/zero on a single node).
	registry    *cluster.Registry
	clusterSync *clusterSync
	// clusterRef is clusterSync for readers that may run before Start sets it (metrics).
	clusterRef    atomic.Pointer[clusterSync]
	clusterStop   context.CancelFunc
	clusterWG     sync.WaitGroup
	clusterLoaded atomic.Bool
	bootstrapped  atomic.Bool
	// bootDone is closed once the bootstrap has run (cluster replicas only).
	bootDone chan struct{}
	// gates: the gate of every subscription (bootstrap and snapshot sequence numbers).
	gates    *source.GateSet
	testHook func(stage string)
	adminTok string
	// maxServices is the max_services limit (the registry's cap is derived from it).
	maxServices int
}

// Start builds the engine and service, binds the listeners (port 0 picks a free port, logged)
// and registers the static services of the configuration file. A static service that fails
// is logged and skipped.
func Start(cfg AppConfig) (*App, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	started := time.Now()
	lim := cfg.Limits.WithDefaults()
	counters := &limits.Counters{}
	memo := cfg.MemoEntries
	if memo == 0 {
		memo = hashing.DefaultMemoEntries
	}
	tr, err := zmqtransport.NewTransport(zmqtransport.TransportConfig{IOThreads: cfg.ZMQIOThreads,
		ReconnectIntervalMax: cfg.ZMQReconnectMax})
	switch {
	case errors.Is(err, zmqtransport.ErrNoCgo):
		// A binary built without cgo serves queries; every ZMQ subscription fails with
		// this error when it is registered.
		log.Warn("no ZMQ in this build: service registrations will fail", "err", err)
		tr = nil
	case err != nil:
		return nil, err
	}
	// A cluster replica's subscriptions buffer until it has bootstrapped from a peer.
	gates := source.NewGateSet(cfg.Cluster != nil)
	eng := engine.New(engine.Config{MaxBlocksPerContext: cfg.MaxBlocksPerContext, MaxBlocks: cfg.MaxBlocks,
		MemoryLimitBytes: cfg.MemoryLimitBytes, Logger: log, MemoEntries: memo,
		PopulateMemo: cfg.PopulateMemo, MemoSecondSight: cfg.MemoSecondSight})
	svc := service.New(service.Options{Engine: eng, Logger: log, MaxServices: lim.MaxServices,
		MaxFieldBytes: lim.MaxFieldBytes,
		Subscribe: service.ZMQSubscriber(source.Options{Transport: tr, MaxMessageSize: cfg.ZMQMaxMessageSize,
			BufferBytes:    cfg.ZMQSourceBufferBytes,
			JoinCheckDelay: cfg.ZMQJoinCheckDelay, LogBurst: cfg.IngestLogBurst, LogInterval: cfg.IngestLogInterval,
			Gates: gates, HashCheckOff: cfg.HashCheckOff, HashCheckLogInterval: cfg.HashCheckLogInterval})})
	app := &App{log: log, Engine: eng, Service: svc, Counters: counters, zmq: tr, gates: gates, testHook: cfg.ClusterTestHook,
		maxServices: lim.MaxServices, adminTok: cfg.AdminToken, maxSnapshotBytes: cfg.MaxSnapshotBytes,
		snapshotReceipts: make(chan struct{}, maxSnapshotReceipts)}
	if app.maxSnapshotBytes <= 0 {
		app.maxSnapshotBytes = snapshot.DefaultMaxBytes
	}
	downloads := cfg.MaxSnapshotDownloads
	if downloads <= 0 {
		downloads = DefaultMaxSnapshotDownloads
	}
	app.snapshotDownloads = make(chan struct{}, downloads)
	app.release = deferred.Start(memoryReleasePeriod, app.releaseMemory)
	counters.OnLargeBody = app.release.Request
	routes := map[string]fasthttp.RequestHandler{"/healthz": healthz, "/readyz": app.readyz,
		SnapshotPath: app.snapshotHandler(cfg.AdminToken)}
	for path, fn := range cfg.ExtraRoutes {
		routes[path] = fn
	}
	if !cfg.DisableMetrics {
		app.Metrics = NewMetrics(svc)
		app.Metrics.registerReadiness(app.Ready)
		app.Metrics.registerCluster(app)
		app.Metrics.RegisterCounters(counters)
		routes["/metrics"] = app.Metrics.Handler()
	}

	accessLog, err := accesslog.Open(cfg.AccessLog)
	if err != nil {
		eng.Close()
		_ = tr.Close()
		return nil, err
	}
	app.AccessLog = accessLog
	if app.Metrics != nil && accessLog != nil {
		app.Metrics.registerAccessLog(accessLog)
	}
	httpBind, rpcBind := cfg.BindAddress, cfg.BindAddress
	if cfg.HTTPBindAddress != "" {
		httpBind = cfg.HTTPBindAddress
	}
	if cfg.RPCBindAddress != "" {
		rpcBind = cfg.RPCBindAddress
	}
	httpLn, err := net.Listen("tcp", net.JoinHostPort(httpBind, strconv.Itoa(cfg.HTTPPort)))
	if err != nil {
		_ = app.AccessLog.Close()
		eng.Close()
		_ = tr.Close()
		return nil, fmt.Errorf("listen http_bind_address %q http_server_port %d: %w", httpBind, cfg.HTTPPort, err)
	}
	app.HTTPAddr = httpLn.Addr().String()
	// One in-flight body budget for both transports.
	budget := limits.NewBudget(lim.MaxInflightBodyBytes, counters)
	var httpObs httpserver.Observer
	var rpcObs rpcserver.Observer
	if app.Metrics != nil {
		httpObs, rpcObs = app.Metrics, app.Metrics
	}
	app.pulse = pulse.New(pulse.Config{Interval: cfg.QueryPulse})
	if app.Metrics != nil && app.pulse != nil {
		app.Metrics.registerPulse(app.pulse)
	}
	app.HTTP = httpserver.New(httpserver.Options{Service: svc, Logger: log, Extra: routes, Metrics: httpObs,
		Limits: lim, Counters: counters, Budget: budget, AdminToken: cfg.AdminToken, AccessLog: app.AccessLog,
		PoisonReleasedBodies: cfg.PoisonReleasedBodies, Pulse: app.pulse})
	httpLn = limits.NewRetryListener(httpLn, "http", log, counters)
	app.wg.Add(1)
	go func() {
		defer app.wg.Done()
		if err := app.HTTP.Serve(httpLn); err != nil {
			log.Error("http server stopped", "err", err)
		}
	}()
	log.Info("http server listening", "addr", app.HTTPAddr, "admin_token", cfg.AdminToken != "")

	if cfg.RPCPort >= 0 {
		rpcLn, err := net.Listen("tcp", net.JoinHostPort(rpcBind, strconv.Itoa(cfg.RPCPort)))
		if err != nil {
			app.Stop()
			return nil, fmt.Errorf("listen rpc_bind_address %q rpc_server_port %d: %w", rpcBind, cfg.RPCPort, err)
		}
		app.RPCAddr = rpcLn.Addr().String()
		refuse := rpcRefusesMutations(cfg.RPCAllowMutations, cfg.AdminToken)
		app.RPC = rpcserver.New(rpcserver.Options{Service: svc, Logger: log, Metrics: rpcObs, Limits: lim, Counters: counters,
			Budget: budget, AccessLog: app.AccessLog, RefuseMutations: refuse, Pulse: app.pulse})
		if warn := rpcExposureWarning(app.RPCAddr, cfg.RPCAllowMutations, refuse); warn != "" {
			log.Warn(warn, "addr", app.RPCAddr)
		}
		rpcLn = limits.NewRetryListener(rpcLn, "rpc", log, counters)
		app.wg.Add(1)
		go func() {
			defer app.wg.Done()
			app.RPC.Serve(rpcLn)
		}()
		log.Info("rpc server listening", "addr", app.RPCAddr, "mutations", !refuse)
	} else {
		log.Info("rpc server disabled")
	}

	ok, failed := 0, cfg.SkippedServices
	for i := range cfg.Services {
		c := &cfg.Services[i]
		if _, serr := svc.RegisterStatic(c); serr != nil {
			failed++
			log.Error("static service failed to start", "service", c.Key(), "err", serr)
			continue
		}
		ok++
	}
	restored := 0
	switch {
	case cfg.Cluster != nil:
		if cfg.StateFile != "" {
			log.Info("cluster mode: registrations live in etcd; the state file is not used", "state_file", cfg.StateFile)
		}
		if err := app.startCluster(*cfg.Cluster); err != nil {
			app.Stop()
			return nil, err
		}
	case cfg.StateFile != "":
		restored = app.restoreState(cfg.StateFile)
	}
	app.ready.Store(true)
	log.Info("conductor started", "http", app.HTTPAddr, "rpc", app.RPCAddr, "static_services", ok,
		"static_failed", failed, "restored_services", restored, "state_file", cfg.StateFile, "access_log", cfg.AccessLog.Path, "config", cfg.ConfigPath, "startup", time.Since(started).String())
	return app, nil
}

// Stop shuts down in order: stop accepting (HTTP, RPC), stop subscribers, close the engine.
// It is idempotent.
func (a *App) Stop() {
	a.stopOnce.Do(func() {
		a.ready.Store(false)
		a.Service.BeginStop()
		if a.HTTP != nil {
			if err := a.HTTP.Shutdown(); err != nil {
				a.log.Warn("http shutdown", "err", err)
			}
		}
		if a.RPC != nil {
			a.RPC.Close()
		}
		a.pulse.Close()       // after the servers: no query can start it again
		if a.release != nil { // nil in a bare App (tests)
			a.release.Close()
		}
		a.wg.Wait()
		a.stopCluster()
		if err := a.AccessLog.Close(); err != nil {
			a.log.Warn("access log close", "err", err)
		}
		n := len(a.Service.Services())
		a.Service.Stop()
		if a.state != nil {
			_ = a.state.Close()
		}
		if a.zmq != nil { // nil: built without cgo
			if err := a.zmq.Close(); err != nil {
				a.log.Warn("zmq context not closed", "err", err)
			}
		}
		a.Engine.Close()
		a.log.Info("conductor stopped", "services", n)
	})
}

// memoryReleasePeriod is how long after a large body was served releaseMemory runs.
const memoryReleasePeriod = 2 * time.Second

// releaseMemory returns the heap that large request bodies used to the OS soon after
// they are gone (the runtime would otherwise keep it for minutes): memoryReleasePeriod
// after a large body was served (limits.Counters.OnLargeBody), at most once per period,
// and once no body is held any more. Nothing runs while none is served.
func (a *App) releaseMemory() {
	if a.Counters.InflightBody.Load() != 0 {
		a.release.Request() // bodies still held: look again a period later
		return
	}
	debug.FreeOSMemory()
}

// restoreState registers the services of the state file and then keeps the file current.
// A corrupt file is set aside and reported. When the file cannot be read or rewritten,
// registrations over HTTP and RPC fail with 500 (they could not survive a restart) while
// everything else keeps working.
func (a *App) restoreState(path string) int {
	sf := &service.StateFile{Path: path, Log: a.log}
	st, err := sf.Load()
	return a.applyState(sf, st, err)
}

// applyState is restoreState after the file was read: it registers what Load found (st,
// err) and makes sf the store. Apart so that a test can read the file and then restore
// with no descriptor left.
func (a *App) applyState(sf *service.StateFile, st service.StateLoad, err error) int {
	path := sf.Path
	a.state = sf
	if err != nil {
		a.log.Error("state file not restored", "path", path, "err", err, "set_aside", st.SetAside)
		if st.SetAside == "" {
			a.Service.SetStore(failedStore{fmt.Errorf("state file %s unreadable at start: %w", path, err)})
			return 0
		}
	}
	for _, skipped := range st.Skipped {
		a.log.Error("state file entry skipped", "err", skipped)
	}
	n := 0
	for i := range st.Services {
		c := &st.Services[i]
		isNew, serr := a.Service.Register(c)
		switch {
		case serr != nil:
			a.log.Error("persisted service not restored", "service", c.Key(), "err", serr)
		case isNew:
			n++
		}
	}
	// Rewrite once so that the file holds exactly what is registered now (entries that
	// no longer validate, or whose registration failed, were logged above).
	if rerr := sf.Reset(a.Service.DynamicServices()); rerr != nil {
		a.log.Error("state file not writable; registrations will fail until it is", "path", path, "err", rerr)
	}
	a.Service.SetStore(sf)
	return n
}

// failedStore refuses every change, with the reason persistence is unavailable.
type failedStore struct{ err error }

func (f failedStore) Put(*service.Config) error { return f.err }
func (f failedStore) Delete(service.ID) error   { return f.err }

// rpcRefusesMutations decides whether RPC Register and Unregister are refused: as the
// rpc_allow_mutations key says, or, when it is unset, whenever an admin token protects
// the HTTP routes (the RPC wire cannot carry the token).
func rpcRefusesMutations(allow *bool, token string) bool {
	if allow != nil {
		return !*allow
	}
	return token != ""
}

// rpcExposureWarning is the start-up warning for an RPC listener that serves Register
// and Unregister, unauthenticated, on an address other hosts can reach, when nobody
// decided it (rpc_allow_mutations unset); "" when there is nothing to warn about.
func rpcExposureWarning(addr string, allow *bool, refuse bool) string {
	if refuse || allow != nil {
		return ""
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return ""
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return ""
	}
	return "RPC Register and Unregister are served without authentication on a non-loopback address (the RPC wire " +
		"carries no token): set rpc_allow_mutations (true to keep them, false to refuse them), set admin_token, " +
		"or bind RPC to loopback with rpc_bind_address"
}
