package server

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/conductor-go/conductor/wire/cororpc"
)

// malformedEndpoints are endpoints no publisher can be reached at: each must be refused
// as a client error on its field, over HTTP and RPC alike, and leave nothing registered.
var malformedEndpoints = []string{
	"garbage", "not-a-valid-endpoint", "tcp:/127.0.0.1:5557", "tcp//127.0.0.1:5557", "tcp://*:5557",
	"tcp://127.0.0.1:5557/x", "tcp://127.0.0.1:5557?x=1", "tcp://127.0.0.1:70000", "tcp://127.0.0.1:0",
	"tcp://127.0.0.1:notaport", "tcp://127.0.0.1", "tcp://:5557", "tcp://[::1]", "tcp://[::1:5557",
	"tcp://[nothex]:5557", "tcp://host name:5557", "tcp://10.0.0.1;10.0.0.2:5557", "ipc://*", "ipc://",
	"udp://127.0.0.1:5557",
}

// TestRegisterMalformedEndpoint: HTTP answers 400 invalid_value on the field (endpoint
// or replay_endpoint) and RPC INVALID_PARAMS, instead of 500 "Failed to subscribe"
// (or, for a port above 65535, a registration that libzmq wraps to another port).
func TestRegisterMalformedEndpoint(t *testing.T) {
	app := startApp(t, true)
	cl, ctx := dialRPC(t, app, 30*time.Second)
	for _, ep := range malformedEndpoints {
		code, resp := msgpackPost(t, app, "/register", registerBody(ep, "bad", 0))
		wantRequestError(t, "endpoint "+ep, code, resp, "invalid_value", "endpoint", -1)
		if msg, _ := resp["error"].(string); !strings.HasPrefix(msg, "endpoint ") {
			t.Errorf("endpoint %s: message %q does not start with the field", ep, msg)
		}
		code, resp = msgpackPost(t, app, "/register", registerBody("tcp://127.0.0.1:5557", "bad", 0, "replay_endpoint", ep))
		wantRequestError(t, "replay_endpoint "+ep, code, resp, "invalid_value", "replay_endpoint", -1)
		_, rc, err := cl.Register(ctx, &cororpc.ServiceConfig{Endpoint: ep, ModelName: "m", TenantID: "default",
			InstanceID: "bad", BlockSize: 16, HashProfile: rgVLLMProfile})
		if err != nil || rc != cororpc.CodeInvalidParams {
			t.Errorf("rpc endpoint %s: code %v err %v, want INVALID_PARAMS", ep, rc, err)
		}
	}
	if _, svcs := doHTTP(t, app, http.MethodGet, "/services", "", nil); asInt(t, svcs["count"]) != 0 {
		t.Errorf("services after refusals = %v", svcs)
	}
	// Well-formed endpoints still register (nobody listens: libzmq connects when one does).
	for i, ep := range []string{"tcp://127.0.0.1:1", "tcp://localhost:65535", "tcp://[::1]:5557", "tcp://engine-0.svc_a:5557",
		"tcp://[fe80::1%lo]:5557", "ipc:///tmp/conductor-endpoint-test"} {
		if code, resp := msgpackPost(t, app, "/register", registerBody(ep, "ok", i)); code != http.StatusOK {
			t.Errorf("register %s: %d %v", ep, code, resp)
		}
	}
}
