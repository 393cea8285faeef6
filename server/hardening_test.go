package server

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestServiceKeysAreStructured: instance "a|b" in tenant "c" and instance "a" in tenant
// "b|c" print the same upstream key "a|b|c|0" but are two services: both register, and
// unregistering one (from the other tenant) leaves the other in place. /metrics keeps
// them apart too.
func TestServiceKeysAreStructured(t *testing.T) {
	app := startApp(t, false)
	for _, r := range []struct{ ep, inst, tenant string }{
		{"tcp://127.0.0.1:51", "a|b", "c"},
		{"tcp://127.0.0.1:52", "a", "b|c"},
	} {
		code, resp := msgpackPost(t, app, "/register", registerBody(r.ep, r.inst, 0, "tenant_id", r.tenant))
		if code != http.StatusOK {
			t.Fatalf("register %s/%s: %d %v", r.inst, r.tenant, code, resp)
		}
	}
	if n := len(app.Service.Services()); n != 2 {
		t.Fatalf("services = %d, want 2", n)
	}
	resp, err := http.Get("http://" + app.HTTPAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `service="a\\|b|c|0"`) || !strings.Contains(string(body), `service="a|b\\|c|0"`) {
		t.Fatalf("/metrics: %d, labels missing:\n%.2000s", resp.StatusCode, body)
	}
	code, out := msgpackPost(t, app, "/unregister", mp("instance_id", "a", "tenant_id", "b|c", "dp_rank", 0))
	if code != http.StatusOK {
		t.Fatalf("unregister: %d %v", code, out)
	}
	// removed_key stays the upstream text.
	if got := out["removed_instances"].([]any)[0]; got != "a|b|c|0" {
		t.Errorf("removed key = %v", got)
	}
	svcs := app.Service.Services()
	if len(svcs) != 1 || svcs[0].InstanceID != "a|b" || svcs[0].TenantID != "c" {
		t.Fatalf("left = %+v, want only a|b in tenant c", svcs)
	}
	// The same request again finds nothing: it never reaches the other tenant's service.
	if code, out := msgpackPost(t, app, "/unregister", mp("instance_id", "a", "tenant_id", "b|c", "dp_rank", 0)); code != http.StatusNotFound {
		t.Fatalf("second unregister: %d %v", code, out)
	}
	if n := len(app.Service.Services()); n != 1 {
		t.Fatalf("services = %d, want 1", n)
	}
}
