package server

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"

	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/internal/accesslog"
	"github.com/conductor-go/conductor/internal/pulse"
	"github.com/conductor-go/conductor/server/internal/limits"
	"github.com/conductor-go/conductor/service"
	"github.com/conductor-go/conductor/wire/cororpc"
)

// Metrics holds the conductor's Prometheus metrics. Query-path updates are lock-free
// atomics (client_golang counters and histograms); per-service and per-context figures are
// read from the subscribers and the engine at scrape time, costing the hot paths nothing.
// Every labelled series whose labels are known in advance (protocols, routes and the
// statuses they answer, RPC functions and codes) exists from the start, at 0, so that
// rate() and alerts see it before its first event. A nil *Metrics disables every update.
// It implements httpserver.Observer and rpcserver.Observer.
type Metrics struct {
	reg *prometheus.Registry

	queries      *prometheus.CounterVec
	queryErrors  *prometheus.CounterVec
	queryLatency *prometheus.HistogramVec
	queryBlocks  prometheus.Histogram
	httpRequests *prometheus.CounterVec
	rpcRequests  *prometheus.CounterVec

	// Pre-resolved children for the hot path (no label hashing per query).
	httpQueries, rpcQueries           prometheus.Counter
	httpQueryLatency, rpcQueryLatency prometheus.Observer
	httpQueryOK                       prometheus.Counter
	byHash                            byHashMetrics
}

// NewMetrics registers every metric of the service layer in a new registry.
func NewMetrics(svc *service.Service) *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	m.queries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "conductor_queries_total", Help: "Prefix-hit queries answered, by protocol."}, []string{"protocol"})
	m.queryErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "conductor_query_errors_total", Help: "Queries rejected or failed, by protocol."}, []string{"protocol"})
	m.queryLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "conductor_query_duration_seconds", Help: "Query handling time in the server (decode, hash, walk, encode).",
		Buckets: prometheus.ExponentialBuckets(5e-6, 2, 18)}, []string{"protocol"})
	m.queryBlocks = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "conductor_query_blocks_hashed", Help: "Blocks hashed per query (the walk stops at the first miss).",
		Buckets: prometheus.ExponentialBuckets(1, 2, 18)})
	m.httpRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "conductor_http_requests_total", Help: "HTTP requests by route and status."}, []string{"route", "status"})
	m.rpcRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "conductor_rpc_requests_total", Help: "RPC requests by function and result code."}, []string{"function", "code"})
	m.reg.MustRegister(m.queries, m.queryErrors, m.queryLatency, m.queryBlocks, m.httpRequests, m.rpcRequests,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		&stateCollector{svc: svc})
	m.httpQueries = m.queries.WithLabelValues("http")
	m.rpcQueries = m.queries.WithLabelValues("rpc")
	m.httpQueryLatency = m.queryLatency.WithLabelValues("http")
	m.rpcQueryLatency = m.queryLatency.WithLabelValues("rpc")
	m.httpQueryOK = m.httpRequests.WithLabelValues("/query", "200")
	m.initByHash()
	m.initLabelSets()
	m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "conductor_services_refused_total",
		Help: "Registrations refused by max_services."}, func() float64 { return float64(svc.RefusedServices()) }))
	return m
}

// httpRouteStatuses are the statuses each HTTP route can answer ("other": an unknown
// path): the label sets of conductor_http_requests_total created at 0.
func httpRouteStatuses() map[string][]int {
	return map[string][]int{
		"/query":         {200, 400, 405, 413, 500, 503},
		"/query_by_hash": {200, 400, 405, 413, 500, 503},
		"/register":      {200, 400, 401, 405, 413, 500, 503},
		"/unregister":    {200, 400, 401, 404, 405, 413, 500, 503},
		"/global_view":   {200, 405, 503},
		"/services":      {200, 405, 503},
		"other":          {404},
	}
}

// rpcFunctionCodes are the result codes each RPC function counted in
// conductor_rpc_requests_total can answer (Query is counted by conductor_queries_total).
func rpcFunctionCodes() map[string][]string {
	return map[string][]string{
		"Register":           serviceCodes(),
		"Unregister":         serviceCodes(),
		"GetGlobalView":      {cororpc.CodeOK.String()},
		"ListServices":       {cororpc.CodeOK.String()},
		"RegisterEx":         serviceCodes(),
		"UnregisterAdapter":  serviceCodes(),
		"ListServiceDetails": {cororpc.CodeOK.String()},
		"unknown":            {"function_not_registered"},
	}
}

// serviceCodes are the RPC codes of a call that reaches the service layer.
func serviceCodes() []string {
	return []string{cororpc.CodeOK.String(), cororpc.CodeInvalidParams.String(), cororpc.CodeServiceNotFound.String(),
		cororpc.CodeConductorUnavailable.String(), cororpc.CodeInternalError.String()}
}

// initLabelSets creates every known label set at 0.
func (m *Metrics) initLabelSets() {
	for _, p := range []string{"http", "rpc", protocolByHash} {
		m.queries.WithLabelValues(p)
		m.queryErrors.WithLabelValues(p)
		m.queryLatency.WithLabelValues(p)
	}
	for route, statuses := range httpRouteStatuses() {
		for _, st := range statuses {
			m.httpRequests.WithLabelValues(route, strconv.Itoa(st))
		}
	}
	for fn, codes := range rpcFunctionCodes() {
		for _, c := range codes {
			m.rpcRequests.WithLabelValues(fn, c)
		}
	}
}

// RegisterCounters exports the limit counters.
func (m *Metrics) RegisterCounters(c *limits.Counters) {
	cnt := func(name, help string, f func() uint64) {
		m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(f()) }))
	}
	gauge := func(name, help string, f func() int64) {
		m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 { return float64(f()) }))
	}
	cnt("conductor_accept_errors_total", "Temporary accept failures (EMFILE...) retried with back-off, both listeners.", c.AcceptErrors.Load)
	cnt("conductor_http_body_too_large_total", "HTTP requests answered 413 (body above max_query_body_bytes / max_admin_body_bytes).", c.BodyTooLarge.Load)
	cnt("conductor_http_body_budget_full_total", "HTTP requests answered 503: max_inflight_body_bytes in use.", c.BodyBudgetFull.Load)
	gauge("conductor_http_inflight_body_bytes", "Request-body bytes held now by HTTP and RPC requests (query bodies count with their decoded size).", c.InflightBody.Load)
	cnt("conductor_http_unauthorized_total", "Requests to state-changing routes without the admin token (401).", c.Unauthorized.Load)
	cnt("conductor_rpc_connections_refused_total", "RPC connections closed at accept: rpc_max_connections reached.", c.RPCConnsRefused.Load)
	gauge("conductor_rpc_connections", "RPC connections open now.", c.RPCConns.Load)
	cnt("conductor_rpc_timeouts_total", "RPC connections closed by rpc_idle_timeout or rpc_read_timeout.", c.RPCTimeouts.Load)
}

// registerPulse exports the query pulse's counters (package internal/pulse).
func (m *Metrics) registerPulse(p *pulse.Pulse) {
	m.reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "conductor_query_pulse_starts_total",
			Help: "Times a query started the query pulse (query_pulse_ms) after a quiet second or more."},
			func() float64 { return float64(p.Stats().Starts) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "conductor_query_pulse_ticks_total",
			Help: "Ticks of the query pulse, which fires only while queries arrive."},
			func() float64 { return float64(p.Stats().Ticks) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "conductor_query_pulse_running",
			Help: "1 while the query pulse fires (queries arrived within the last second), else 0."},
			func() float64 {
				if p.Stats().Running {
					return 1
				}
				return 0
			}))
}

// registerAccessLog exports the access log's dropped lines and write errors.
func (m *Metrics) registerAccessLog(l *accesslog.Log) {
	m.reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "conductor_access_log_dropped_lines_total",
			Help: "Access log lines dropped because the buffer was full (the writer fell behind)."},
			func() float64 { return float64(l.Dropped()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "conductor_access_log_write_errors_total",
			Help: "Failed writes of the access log buffer."},
			func() float64 { return float64(l.WriteErrors()) }))
}

// Registry exposes the registry (tests, embedding).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the Prometheus text exposition.
func (m *Metrics) Handler() fasthttp.RequestHandler {
	return fasthttpadaptor.NewFastHTTPHandler(promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
}

// ObserveHTTPQuery records one /query: its latency, outcome and blocks hashed.
func (m *Metrics) ObserveHTTPQuery(start time.Time, status int, blocks int) {
	if m == nil {
		return
	}
	m.httpQueries.Inc()
	m.httpQueryLatency.Observe(time.Since(start).Seconds())
	if status == http.StatusOK {
		m.httpQueryOK.Inc()
		m.queryBlocks.Observe(float64(blocks))
		return
	}
	m.queryErrors.WithLabelValues("http").Inc()
	m.httpRequests.WithLabelValues("/query", strconv.Itoa(status)).Inc()
}

// ObserveRPCQuery records one RPC Query call: its latency, outcome and blocks hashed.
func (m *Metrics) ObserveRPCQuery(start time.Time, ok bool, blocks int) {
	if m == nil {
		return
	}
	m.rpcQueries.Inc()
	m.rpcQueryLatency.Observe(time.Since(start).Seconds())
	if ok {
		m.queryBlocks.Observe(float64(blocks))
	} else {
		m.queryErrors.WithLabelValues("rpc").Inc()
	}
}

// ObserveHTTP counts a non-query HTTP request.
func (m *Metrics) ObserveHTTP(route string, status int) {
	if m == nil {
		return
	}
	m.httpRequests.WithLabelValues(route, strconv.Itoa(status)).Inc()
}

// ObserveRPC counts one RPC request by function name and business code.
func (m *Metrics) ObserveRPC(function, code string) {
	if m == nil {
		return
	}
	m.rpcRequests.WithLabelValues(function, code).Inc()
}

// stateCollector reads per-service and per-context figures at scrape time.
type stateCollector struct{ svc *service.Service }

var (
	descSvcReceived = prometheus.NewDesc("conductor_service_messages_received_total",
		"ZMQ messages received from the publisher.", []string{"service", "type"}, nil)
	descSvcApplied = prometheus.NewDesc("conductor_service_messages_applied_total",
		"Batches handed to the index in sequence order.", []string{"service", "type"}, nil)
	descSvcEvents = prometheus.NewDesc("conductor_service_events_total",
		"Events by outcome: applied, rejected (invalid), ignored (medium not indexed).", []string{"service", "type", "outcome"}, nil)
	descSvcBlocks = prometheus.NewDesc("conductor_service_blocks_applied_total",
		"Block hashes stored or removed.", []string{"service", "type"}, nil)
	descSvcBurstBatches = prometheus.NewDesc("conductor_service_burst_batches_total",
		"Batches handed to the index deferred, as part of a burst (every batch read while more were ready), applied at the burst's flush.", []string{"service", "type"}, nil)
	descSvcBurstFlushes = prometheus.NewDesc("conductor_service_burst_flushes_total",
		"Context-writer requests that applied a burst of deferred batches (burst_batches / burst_flushes is the mean burst size).", []string{"service", "type"}, nil)
	descSvcRejected = prometheus.NewDesc("conductor_service_rejected_total",
		"Messages rejected, by reason.", []string{"service", "type", "reason"}, nil)
	descSvcGaps = prometheus.NewDesc("conductor_service_sequence_gaps_total",
		"Sequence gaps detected.", []string{"service", "type"}, nil)
	descSvcDropped = prometheus.NewDesc("conductor_service_sequences_missed_total",
		"Sequence numbers missing in gaps.", []string{"service", "type"}, nil)
	descSvcReplays = prometheus.NewDesc("conductor_service_replays_total",
		"Replay recoveries by result.", []string{"service", "type", "result"}, nil)
	descSvcCatchUps = prometheus.NewDesc("conductor_service_catchups_total",
		"Catch-ups of the publisher's replay buffer at subscribe time, by result.", []string{"service", "type", "result"}, nil)
	descSvcJoinChecks = prometheus.NewDesc("conductor_service_join_checks_total",
		"Replay checks after the subscription joined (for batches published before it took effect), by result.", []string{"service", "type", "result"}, nil)
	descSvcGapsCovered = prometheus.NewDesc("conductor_service_gaps_covered_total",
		"Gaps no replay could close whose batches a bootstrapping replica holds from its peer's snapshot (the source stays fresh instead of going stale).", []string{"service", "type"}, nil)
	descSvcRestarts = prometheus.NewDesc("conductor_service_publisher_restarts_total",
		"Publisher restarts detected (sequence reset); the source's previous entries were retracted.", []string{"service", "type"}, nil)
	descSvcStale = prometheus.NewDesc("conductor_service_stale",
		"1 when the source is stale (its entries are retracted until it is registered again).", []string{"service", "type"}, nil)
	descSvcWaiting = prometheus.NewDesc("conductor_service_waiting_for_resources",
		"1 while the subscription cannot open its sockets (out of file descriptors) and retries.", []string{"service", "type"}, nil)
	descSvcAge = prometheus.NewDesc("conductor_service_last_event_age_seconds",
		"Seconds since the last message from the publisher (absent before the first).", []string{"service", "type"}, nil)
	descSvcLeaderMissing = prometheus.NewDesc("conductor_service_master_leader_missing",
		"1 while a Mooncake master locator has no usable leader (master_view key absent or unusable): no stream, waiting.", []string{"service", "type"}, nil)
	descSvcLeaderChanges = prometheus.NewDesc("conductor_service_master_leader_changes_total",
		"Subscriptions to a Mooncake master leader after the first (a new leader, or a new term after the key was missing).", []string{"service", "type"}, nil)
	descSvcLeaderStreams = prometheus.NewDesc("conductor_service_master_leader_streams_total",
		"New leader streams by outcome: continued (previous bindings kept) or retracted (they did not continue it).", []string{"service", "type", "outcome"}, nil)
	descSvcLeaderVersion = prometheus.NewDesc("conductor_service_master_view_version",
		"Version (etcd create revision) of the master view last subscribed to.", []string{"service", "type"}, nil)
	descSvcEventForms = prometheus.NewDesc("conductor_service_events_by_form_total",
		"Engine events decoded, by encoding: map (tagged maps) or array (tagged positional arrays: vLLM <= 0.23, SGLang <= 0.5.19).", []string{"service", "type", "form"}, nil)
	descSvcHashVerified = prometheus.NewDesc("conductor_service_hash_verified_total",
		"BlockStored events the profile self-check recomputed under the registered hash profile (every event until 64 were, then one batch in 128), by adapter context.", []string{"service", "type", "lora"}, nil)
	descSvcHashMismatch = prometheus.NewDesc("conductor_service_hash_mismatch_total",
		"Verified BlockStored events whose block hashes the registered hash profile does not reproduce: queries of that context miss; /services shows the profile that would match (hash_check).", []string{"service", "type", "lora"}, nil)
	descSvcHashUnverifiable = prometheus.NewDesc("conductor_service_hash_unverifiable_total",
		"BlockStored events of checked batches the self-check could not recompute (a parent it never saw, multimodal or embedding inputs).", []string{"service", "type", "lora"}, nil)
	descCtxBlocks = prometheus.NewDesc("conductor_context_blocks",
		"Distinct blocks indexed (prefix_count).", []string{"tenant", "model", "lora", "block_size"}, nil)
	descCtxSlots = prometheus.NewDesc("conductor_context_slots",
		"Registered engine (instance, rank) slots.", []string{"tenant", "model", "lora", "block_size"}, nil)
	descMemoHits = prometheus.NewDesc("conductor_query_memo_hits_total",
		"Query blocks whose key came from the key memo (no SHA-256).", nil, nil)
	descMemoMisses = prometheus.NewDesc("conductor_query_memo_misses_total",
		"Query blocks SHA-256 hashed while the key memo was enabled.", nil, nil)
	descMemoEvictions = prometheus.NewDesc("conductor_query_memo_evictions_total",
		"Key memo entries (runs of 8 blocks) replaced by newer ones.", nil, nil)
	descMemoReasked = prometheus.NewDesc("conductor_query_memo_reasked_total",
		"Key memo lookups that missed a run the memo had evicted lately: prompts asked again after the memo lost them (it grows with use on these).", nil, nil)
	descMemoEntries = prometheus.NewDesc("conductor_query_memo_capacity_entries",
		"Key memo capacity in blocks (0: disabled).", nil, nil)
	descCtxEvictions = prometheus.NewDesc("conductor_context_evicted_blocks_total",
		"Blocks evicted by the per-context capacity bound.", []string{"tenant", "model", "lora", "block_size"}, nil)
)

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descSvcReceived, descSvcApplied, descSvcEvents, descSvcBlocks, descSvcBurstBatches, descSvcBurstFlushes, descSvcRejected,
		descSvcEventForms, descSvcHashVerified, descSvcHashMismatch, descSvcHashUnverifiable,
		descSvcGaps, descSvcDropped, descSvcReplays, descSvcCatchUps, descSvcJoinChecks, descSvcGapsCovered, descSvcRestarts, descSvcStale, descSvcWaiting, descSvcAge,
		descSvcLeaderMissing, descSvcLeaderChanges, descSvcLeaderStreams, descSvcLeaderVersion, descCtxBlocks, descCtxSlots, descCtxEvictions,
		descMemoHits, descMemoMisses, descMemoEvictions, descMemoReasked, descMemoEntries} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	for _, s := range c.svc.Stats() {
		k, t := s.Label, s.Config.Kind.String()
		st := &s.Stats
		cnt := func(d *prometheus.Desc, v uint64, extra ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), append([]string{k, t}, extra...)...)
		}
		cnt(descSvcReceived, st.Received)
		cnt(descSvcApplied, st.Applied)
		cnt(descSvcGaps, st.Gaps)
		cnt(descSvcDropped, st.Dropped)
		cnt(descSvcReplays, st.ReplaysOK, "ok")
		cnt(descSvcReplays, st.ReplaysFailed, "failed")
		cnt(descSvcCatchUps, st.CatchUps, "ok")
		cnt(descSvcCatchUps, st.CatchUpsFailed, "failed")
		cnt(descSvcJoinChecks, st.JoinChecks, "ok")
		cnt(descSvcJoinChecks, st.JoinChecksFailed, "failed")
		cnt(descSvcGapsCovered, st.HolesTaken)
		cnt(descSvcRestarts, st.Restarts)
		cnt(descSvcRejected, st.ConsumeErrors, "malformed_message")
		cnt(descSvcRejected, st.Rejected, "batch_rejected")
		cnt(descSvcRejected, st.Duplicates, "duplicate_sequence")
		cnt(descSvcRejected, st.ProtocolErrors, "protocol_error")
		if s.HasHandler {
			h := &s.Handler
			cnt(descSvcRejected, h.BatchesDropped, "invalid_envelope")
			cnt(descSvcEvents, h.EventsApplied, "applied")
			cnt(descSvcEvents, h.EventsRejected, "rejected")
			cnt(descSvcEvents, h.EventsIgnored, "ignored")
			cnt(descSvcBlocks, h.BlocksApplied)
			cnt(descSvcBurstBatches, h.BurstBatches)
			cnt(descSvcBurstFlushes, h.BurstFlushes)
			if s.Config.Kind.IsEngine() {
				cnt(descSvcEventForms, h.EventsMapForm, "map")
				cnt(descSvcEventForms, h.EventsArrayForm, "array")
			}
		}
		// Every adapter context's check exists from its registration, at 0.
		for _, c := range s.Checks {
			cnt(descSvcHashVerified, c.Stats.Verified, c.LoraName)
			cnt(descSvcHashMismatch, c.Stats.Mismatched, c.LoraName)
			cnt(descSvcHashUnverifiable, c.Stats.Unverifiable, c.LoraName)
		}
		stale := 0.0
		if st.Stale {
			stale = 1
		}
		ch <- prometheus.MustNewConstMetric(descSvcStale, prometheus.GaugeValue, stale, k, t)
		waiting := 0.0
		if st.Waiting {
			waiting = 1
		}
		ch <- prometheus.MustNewConstMetric(descSvcWaiting, prometheus.GaugeValue, waiting, k, t)
		if s.HasLeader {
			l := &s.Leader
			missing := 0.0
			if l.Missing {
				missing = 1
			}
			ch <- prometheus.MustNewConstMetric(descSvcLeaderMissing, prometheus.GaugeValue, missing, k, t)
			cnt(descSvcLeaderChanges, l.Changes)
			cnt(descSvcLeaderStreams, l.Continuations, "continued")
			cnt(descSvcLeaderStreams, l.Retractions, "retracted")
			ch <- prometheus.MustNewConstMetric(descSvcLeaderVersion, prometheus.GaugeValue, float64(l.Version), k, t)
		}
		if st.LastEventUnixNano > 0 {
			age := now.Sub(time.Unix(0, st.LastEventUnixNano)).Seconds()
			ch <- prometheus.MustNewConstMetric(descSvcAge, prometheus.GaugeValue, age, k, t)
		}
	}
	eng := c.svc.Engine()
	ms := eng.MemoStats()
	ch <- prometheus.MustNewConstMetric(descMemoHits, prometheus.CounterValue, float64(ms.Hits))
	ch <- prometheus.MustNewConstMetric(descMemoMisses, prometheus.CounterValue, float64(ms.Misses))
	ch <- prometheus.MustNewConstMetric(descMemoEvictions, prometheus.CounterValue, float64(ms.Evictions))
	ch <- prometheus.MustNewConstMetric(descMemoReasked, prometheus.CounterValue, float64(ms.Reasked))
	ch <- prometheus.MustNewConstMetric(descMemoEntries, prometheus.GaugeValue, float64(ms.Capacity))
	for _, v := range eng.GlobalView() {
		st, ok := eng.Stats(v.Key)
		if !ok {
			continue
		}
		labels := contextLabels(v.Key)
		ch <- prometheus.MustNewConstMetric(descCtxBlocks, prometheus.GaugeValue, float64(st.Blocks), labels...)
		ch <- prometheus.MustNewConstMetric(descCtxSlots, prometheus.GaugeValue, float64(st.Slots), labels...)
		ch <- prometheus.MustNewConstMetric(descCtxEvictions, prometheus.CounterValue, float64(st.EvictedBlocks), labels...)
	}
}

func contextLabels(k engine.ContextKey) []string {
	return []string{k.TenantID, k.ModelName, k.LoraName, strconv.FormatInt(k.BlockSize, 10)}
}

// byHashMetrics are the pre-resolved /query_by_hash children of the query metrics
// (protocol label "http_by_hash").
type byHashMetrics struct {
	queries prometheus.Counter
	latency prometheus.Observer
	ok      prometheus.Counter
	errors  prometheus.Counter
}

const protocolByHash = "http_by_hash"

func (m *Metrics) initByHash() {
	m.byHash = byHashMetrics{
		queries: m.queries.WithLabelValues(protocolByHash),
		latency: m.queryLatency.WithLabelValues(protocolByHash),
		ok:      m.httpRequests.WithLabelValues("/query_by_hash", "200"),
		errors:  m.queryErrors.WithLabelValues(protocolByHash),
	}
}

// ObserveHTTPQueryByHash records one /query_by_hash: its latency and outcome.
func (m *Metrics) ObserveHTTPQueryByHash(start time.Time, status int) {
	if m == nil {
		return
	}
	m.byHash.queries.Inc()
	m.byHash.latency.Observe(time.Since(start).Seconds())
	if status == http.StatusOK {
		m.byHash.ok.Inc()
		return
	}
	m.byHash.errors.Inc()
	m.httpRequests.WithLabelValues("/query_by_hash", strconv.Itoa(status)).Inc()
}
