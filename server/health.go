package server

import (
	"encoding/json"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
)

// Ready reports whether the listeners are up, the static services were subscribed and,
// in a cluster, the registry was loaded (and Stop has not begun).
func (a *App) Ready() bool {
	return a.ready.Load() && (a.registry == nil || (a.clusterLoaded.Load() && a.bootstrapped.Load()))
}

// WaitReady waits until the App is Ready, for at most timeout (a cluster replica first
// loads the registry and bootstraps from a peer); it reports whether it is.
func (a *App) WaitReady(timeout time.Duration) bool {
	if a.bootDone != nil {
		t := time.NewTimer(timeout)
		defer t.Stop()
		select {
		case <-a.bootDone:
		case <-t.C:
		}
	}
	return a.Ready()
}

// healthz answers liveness: the process serves HTTP.
func healthz(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType("text/plain; charset=utf-8")
	ctx.SetBodyString("ok\n")
}

// readyz answers readiness in JSON: 200 once listening with static services subscribed,
// 503 before that and while stopping.
func (a *App) readyz(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType("application/json")
	if !a.Ready() {
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		ctx.SetBodyString(`{"ready":false}`)
		return
	}
	body := `{"ready":true,"services":` + strconv.Itoa(len(a.Service.Services()))
	if a.clusterSync != nil {
		// Registry entries this replica could not apply: it answers without them (it
		// never invents a hit), so it stays ready, but says so; the entries are retried.
		if un := a.clusterSync.unappliedReasons(); len(un) > 0 {
			b, _ := json.Marshal(un)
			body += `,"registry_unapplied":` + string(b)
		}
	}
	ctx.SetBodyString(body + `}`)
}

// registerCluster exports the cluster replica's registry health (zero on a single node):
// registry entries it could not apply, registry resets it found, registrations it wrote
// back after one. Read at scrape time (the replica's glue may not exist yet).
func (m *Metrics) registerCluster(a *App) {
	of := func(f func(c *clusterSync) float64) func() float64 {
		return func() float64 {
			if c := a.clusterRef.Load(); c != nil {
				return f(c)
			}
			return 0
		}
	}
	m.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "conductor_registry_unapplied_services",
			Help: "Registry entries this replica could not apply (retried every second; see /readyz for why)."},
			of(func(c *clusterSync) float64 { return float64(c.unappliedN.Load()) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "conductor_registry_resets_total",
			Help: "Times this replica found the etcd registry reset (restored empty or from an older backup)."},
			of(func(c *clusterSync) float64 { return float64(c.store.reg.Resets()) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "conductor_registry_republished_total",
			Help: "Registrations this replica wrote back to the registry after a reset."},
			of(func(c *clusterSync) float64 { return float64(c.republished.Load()) })))
}

// registerReadiness exports conductor_ready (1 while /readyz answers 200) for alerting on
// a lost readiness; ready is read at scrape time.
func (m *Metrics) registerReadiness(ready func() bool) {
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "conductor_ready",
		Help: "1 when the conductor is ready (listening, static services subscribed, not stopping), else 0.",
	}, func() float64 {
		if ready() {
			return 1
		}
		return 0
	}))
}
