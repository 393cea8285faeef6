package server

import "testing"

// gaugeValue reads one unlabelled gauge from the registry.
func gaugeValue(t *testing.T, app *App, name string) float64 {
	t.Helper()
	mfs, err := app.Metrics.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("metric %s not exported", name)
	return 0
}

// TestReadyGauge: conductor_ready follows readiness (what /readyz answers).
func TestReadyGauge(t *testing.T) {
	app := startApp(t, false)
	if v := gaugeValue(t, app, "conductor_ready"); v != 1 {
		t.Errorf("conductor_ready after start = %v, want 1", v)
	}
	app.ready.Store(false)
	if v := gaugeValue(t, app, "conductor_ready"); v != 0 {
		t.Errorf("conductor_ready when not ready = %v, want 0", v)
	}
	app.ready.Store(true)
}
