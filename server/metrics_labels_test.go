package server

import (
	"strconv"
	"testing"
)

// TestLabelledCountersStartAtZero: a fresh conductor, before any request, exports the
// known label sets of its labelled counters at 0 (rate() and alerts need a series before
// its first event): the query counters of every protocol, every HTTP route with each
// status it can answer, every RPC function with each code it can return.
func TestLabelledCountersStartAtZero(t *testing.T) {
	app := startApp(t, true)
	f := scrape(t, app)
	type series struct {
		name   string
		labels []string
	}
	// The series the alert rules and dashboards read first, named here rather than
	// taken from the tables the metrics are built from.
	want := []series{
		{"conductor_queries_total", []string{"protocol", "http"}},
		{"conductor_queries_total", []string{"protocol", "rpc"}},
		{"conductor_queries_total", []string{"protocol", "http_by_hash"}},
		{"conductor_query_errors_total", []string{"protocol", "http"}},
		{"conductor_query_errors_total", []string{"protocol", "rpc"}},
		{"conductor_query_errors_total", []string{"protocol", "http_by_hash"}},
		{"conductor_http_requests_total", []string{"route", "/query", "status", "200"}},
		{"conductor_http_requests_total", []string{"route", "/query", "status", "400"}},
		{"conductor_http_requests_total", []string{"route", "/query", "status", "500"}},
		{"conductor_http_requests_total", []string{"route", "/query", "status", "503"}},
		{"conductor_http_requests_total", []string{"route", "/register", "status", "401"}},
		{"conductor_http_requests_total", []string{"route", "/unregister", "status", "404"}},
		{"conductor_rpc_requests_total", []string{"function", "Register", "code", "OK"}},
		{"conductor_rpc_requests_total", []string{"function", "Register", "code", "INVALID_PARAMS"}},
		{"conductor_rpc_requests_total", []string{"function", "Register", "code", "INTERNAL_ERROR"}},
		{"conductor_rpc_requests_total", []string{"function", "Unregister", "code", "SERVICE_NOT_FOUND"}},
		{"conductor_rpc_requests_total", []string{"function", "GetGlobalView", "code", "OK"}},
		{"conductor_rpc_requests_total", []string{"function", "ListServices", "code", "OK"}},
		{"conductor_services_refused_total", nil},
	}
	// And every label set of the tables.
	for route, statuses := range httpRouteStatuses() {
		for _, st := range statuses {
			want = append(want, series{"conductor_http_requests_total", []string{"route", route, "status", strconv.Itoa(st)}})
		}
	}
	for fn, codes := range rpcFunctionCodes() {
		for _, c := range codes {
			want = append(want, series{"conductor_rpc_requests_total", []string{"function", fn, "code", c}})
		}
	}
	for _, s := range want {
		v, ok := metricValue(f, s.name, s.labels...)
		if !ok || v != 0 {
			t.Errorf("%s%v = %v (present %v), want a series at 0", s.name, s.labels, v, ok)
		}
	}
	// The histogram of each protocol is there too, with no observation.
	for _, p := range []string{"http", "rpc", "http_by_hash"} {
		if v, ok := metricValue(f, "conductor_query_duration_seconds", "protocol", p); !ok || v != 0 {
			t.Errorf("conductor_query_duration_seconds{protocol=%s}: count %v (present %v)", p, v, ok)
		}
	}
	// A request counts on its series: the first /query makes /query 200 one.
	msgpackPost(t, app, "/query", queryBody("m", 16, seqTokens(16, 1)))
	if v, _ := metricValue(scrape(t, app), "conductor_http_requests_total", "route", "/query", "status", "200"); v != 1 {
		t.Errorf("/query 200 after one query = %v", v)
	}
}
