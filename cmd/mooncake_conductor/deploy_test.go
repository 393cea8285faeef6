package main

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/conductor-go/conductor/ingest/zmqtest"
	"github.com/conductor-go/conductor/rpcclient"
)

// deployDir holds the Grafana dashboard and the Prometheus rules.
var deployDir = filepath.Join("..", "..", "deploy")

// metricRef matches the metric names the dashboard and rules may use: the binary's own
// (conductor_), the process and Go runtime collectors', and Prometheus' synthetic up.
var metricRef = regexp.MustCompile(`\b((?:conductor|process|go)_[a-z0-9_]+|up)\b`)

// matcherRef matches `metric{label...` selectors, to check the labels they filter on.
var matcherRef = regexp.MustCompile(`\b((?:conductor|process|go)_[a-z0-9_]+)\{([^}]*)\}`)

// byRef matches the label lists of `by (...)` clauses.
var byRef = regexp.MustCompile(`\bby \(([^)]*)\)`)

// dashboardExprs returns every query of the Grafana dashboard, checking its shape.
func dashboardExprs(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(deployDir, "grafana", "conductor.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string `json:"title"`
		UID    string `json:"uid"`
		Panels []struct {
			ID      int    `json:"id"`
			Type    string `json:"type"`
			Title   string `json:"title"`
			Targets []struct {
				Expr  string `json:"expr"`
				RefID string `json:"refId"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("dashboard is not valid JSON: %v", err)
	}
	if dash.Title == "" || dash.UID == "" || len(dash.Panels) < 10 {
		t.Fatalf("dashboard title %q uid %q with %d panels", dash.Title, dash.UID, len(dash.Panels))
	}
	var exprs []string
	ids := map[int]bool{}
	for _, p := range dash.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d repeated", p.ID)
		}
		ids[p.ID] = true
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" || tg.RefID == "" {
				t.Errorf("panel %q: empty query or refId", p.Title)
			}
			exprs = append(exprs, tg.Expr)
		}
	}
	return exprs
}

// ruleExprs returns the expr of every alerting rule (one line each, as the file keeps them).
func ruleExprs(t *testing.T) []string {
	t.Helper()
	f, err := os.Open(filepath.Join(deployDir, "prometheus", "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var exprs []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if e, ok := strings.CutPrefix(line, "expr:"); ok {
			exprs = append(exprs, strings.TrimSpace(e))
		}
	}
	if len(exprs) < 6 {
		t.Fatalf("%d alert expressions found", len(exprs))
	}
	return exprs
}

// scrape reads the exposition: every series name with the label names it carries.
func scrape(t *testing.T, url string) map[string]map[string]bool {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]map[string]bool{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name, rest, _ := strings.Cut(line, " ")
		labels := map[string]bool{}
		if i := strings.IndexByte(line, '{'); i >= 0 && i < len(name) {
			name, rest = line[:i], line[i+1:]
			for _, kv := range strings.Split(rest[:strings.IndexByte(rest, '}')], ",") {
				if k, _, ok := strings.Cut(kv, "="); ok {
					labels[k] = true
				}
			}
		}
		if out[name] == nil {
			out[name] = map[string]bool{}
		}
		for k := range labels {
			out[name][k] = true
		}
	}
	return out
}

// TestDeployMetricsExist: a live binary with one vLLM service that has sent events and
// answered queries over HTTP and RPC exports every metric the Grafana dashboard and the
// alert rules name (histograms as _bucket/_sum/_count), with the labels they filter and
// group on; `up` is Prometheus' own. promtool checks and unit-tests the rules when it is
// installed (make test installs it).
func TestDeployMetricsExist(t *testing.T) {
	pub, err := zmqtest.NewPublisher(zmqtest.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	httpPort, rpcPort := freePort(t), freePort(t)
	config := writeJSON(t, t.TempDir(), map[string]any{
		"http_server_port": httpPort, "rpc_server_port": rpcPort,
		"kvevent_instance": map[string]any{"vllm-a-r0": vllmEntry(pub.Endpoint())},
	})
	c := startConductor(t, config)
	addr := "127.0.0.1:" + strconv.Itoa(httpPort)
	c.waitHTTP(addr)
	c.waitHTTP("127.0.0.1:" + strconv.Itoa(rpcPort))
	base := "http://" + addr
	if err := pub.WaitSubscribers(1, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	tokens := tokenRun(7, 32)
	if _, err := pub.Publish(vllmBatch(vllmKeys(t, tokens))); err != nil {
		t.Fatal(err)
	}
	c.waitDeviceHit(base, "engine-a", tokens, 32)
	call(t, http.MethodPost, base+"/query", mp("model", "", "block_size", 16, "token_ids", anys(tokens))) // a 400
	rc, err := rpcclient.Dial("127.0.0.1:"+strconv.Itoa(rpcPort), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rc.ListServices(context.Background()); err != nil {
		t.Fatal(err)
	}
	rc.Close()

	have := scrape(t, base+"/metrics")
	exprs := append(dashboardExprs(t), ruleExprs(t)...)
	var missing []string
	seen := map[string]bool{}
	for _, e := range exprs {
		for _, m := range metricRef.FindAllString(e, -1) {
			if m == "up" || seen[m] {
				continue
			}
			seen[m] = true
			if have[m] == nil {
				missing = append(missing, m)
			}
		}
		for _, sel := range matcherRef.FindAllStringSubmatch(e, -1) {
			for _, kv := range strings.Split(sel[2], ",") {
				label := strings.TrimSpace(strings.FieldsFunc(kv, func(r rune) bool { return r == '=' || r == '!' || r == '~' })[0])
				if have[sel[1]] != nil && !have[sel[1]][label] {
					t.Errorf("%q filters %s on label %q, which it does not carry", e, sel[1], label)
				}
			}
		}
		for _, by := range byRef.FindAllStringSubmatch(e, -1) {
			for _, label := range strings.Split(by[1], ",") {
				label = strings.TrimSpace(label)
				found := false
				for _, m := range metricRef.FindAllString(e, -1) {
					found = found || have[m][label]
				}
				if !found {
					t.Errorf("%q groups by %q, which none of its metrics carries", e, label)
				}
			}
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("metrics used by deploy/ but not exported: %v", missing)
	}
	if len(seen) < 20 {
		t.Errorf("only %d distinct metrics referenced", len(seen))
	}
	c.terminate()

	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Log("promtool not installed; rule checks skipped (make test installs it)")
		return
	}
	for _, args := range [][]string{{"check", "rules", "alerts.yml"}, {"test", "rules", "alerts_test.yml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = filepath.Join(deployDir, "prometheus")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}
