package target

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// httpGet fetches http://addr+path and returns the status code and up to 16 MiB of body.
func httpGet(ctx context.Context, addr, path string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	return resp.StatusCode, body, err
}

// WaitReady polls the conductor's /readyz at addr until it answers 200, for at most
// timeout.
func WaitReady(ctx context.Context, addr string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		code, body, err := httpGet(ctx, addr, "/readyz")
		if err == nil && code == http.StatusOK {
			return nil
		}
		select {
		case <-ctx.Done():
			if err == nil {
				err = fmt.Errorf("/readyz answered %d: %s", code, strings.TrimSpace(string(body)))
			}
			return fmt.Errorf("conductor at %s not ready after %v: %w", addr, timeout, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Ready reports whether the conductor's /readyz at addr answers 200 now.
func Ready(ctx context.Context, addr string) bool {
	code, _, err := httpGet(ctx, addr, "/readyz")
	return err == nil && code == http.StatusOK
}

// Metrics is a Prometheus text exposition: every sample's value by its series, the metric
// name with its labels as exposed (`name{a="x",b="y"}`).
type Metrics map[string]float64

// ReadMetrics fetches and parses the conductor's /metrics at addr.
func ReadMetrics(ctx context.Context, addr string) (Metrics, error) {
	code, body, err := httpGet(ctx, addr, "/metrics")
	if err != nil {
		return nil, fmt.Errorf("read /metrics: %w", err)
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("read /metrics: answered %d", code)
	}
	return ParseMetrics(body)
}

// ParseMetrics parses a Prometheus text exposition; comment lines are skipped, a
// sample whose value is not a number is an error.
func ParseMetrics(body []byte) (Metrics, error) {
	m := Metrics{}
	for _, line := range strings.Split(string(body), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		// The value follows the series; label values may hold spaces, so cut at the last.
		i := strings.LastIndexByte(line, ' ')
		if i <= 0 {
			return nil, fmt.Errorf("metrics line %q: no value", line)
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %w", line, err)
		}
		m[line[:i]] = v
	}
	return m, nil
}

// Sum adds the samples of metric name whose labels contain every one of labels (each
// written as in the exposition, `result="ok"`), and reports whether any was found.
func (m Metrics) Sum(name string, labels ...string) (float64, bool) {
	var sum float64
	found := false
	for series, v := range m {
		n, rest, _ := strings.Cut(series, "{")
		if n != name {
			continue
		}
		match := true
		for _, l := range labels {
			if !strings.HasPrefix(rest, l) && !strings.Contains(rest, ","+l) {
				match = false
				break
			}
		}
		if match {
			sum += v
			found = true
		}
	}
	return sum, found
}
