package server

import "github.com/prometheus/client_golang/prometheus"

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
