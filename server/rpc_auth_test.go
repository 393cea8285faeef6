package server

import (
	"net/http"
	"testing"
	"time"

	"github.com/conductor-go/conductor/wire/cororpc"
)

// TestRPCMutationsFollowAdminToken: with an admin token set, RPC Register and Unregister
// (whose wire carries no token) answer CONDUCTOR_UNAVAILABLE and change nothing, while
// queries and listings are served; rpc_allow_mutations true serves them anyway, false
// refuses them even without a token.
func TestRPCMutationsFollowAdminToken(t *testing.T) {
	yes, no := true, false
	for _, c := range []struct {
		name   string
		token  string
		allow  *bool
		served bool
	}{
		{"no token", "", nil, true},
		{"token", "s3cret", nil, false},
		{"token, allowed", "s3cret", &yes, true},
		{"no token, refused", "", &no, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			app, logs := startCapturing(t, AppConfig{AdminToken: c.token, RPCAllowMutations: c.allow})
			cl, ctx := dialRPC(t, app, 20*time.Second)
			pub := newPublisher(t, false)
			_, code, err := cl.Register(ctx, &cororpc.ServiceConfig{Endpoint: pub.Endpoint(), ModelName: "m",
				TenantID: "default", InstanceID: "e", BlockSize: 16, HashProfile: rgVLLMProfile})
			want := cororpc.CodeOK
			if !c.served {
				want = cororpc.CodeConductorUnavailable
			}
			if err != nil || code != want {
				t.Fatalf("Register: %v %v, want %v", code, err, want)
			}
			list, err := cl.ListServices(ctx)
			if err != nil || len(list) != map[bool]int{true: 1, false: 0}[c.served] {
				t.Fatalf("ListServices after Register: %v %v", list, err)
			}
			if !c.served {
				// Registered over HTTP with the token (or none), then Unregister over RPC is refused.
				if code, _, body := httpRaw(t, app, http.MethodPost, "/register", registerBody(pub.Endpoint(), "e", 0),
					"Content-Type", "application/msgpack", "Authorization", bearer(c.token)); code != http.StatusOK {
					t.Fatalf("HTTP register: %d %s", code, body)
				}
				if logs.Count("rpc Register refused") != 1 {
					t.Errorf("refusal not logged:\n%s", logs)
				}
			}
			_, code, err = cl.Unregister(ctx, "e", "default", 0)
			if err != nil || code != want {
				t.Fatalf("Unregister: %v %v, want %v", code, err, want)
			}
			if n := len(app.Service.Services()); n != map[bool]int{true: 0, false: 1}[c.served] {
				t.Fatalf("services after Unregister: %d", n)
			}
		})
	}
}

// TestRPCExposureWarning: the start-up warning is given exactly when RPC serves
// unauthenticated changes on a non-loopback address and nobody set rpc_allow_mutations.
func TestRPCExposureWarning(t *testing.T) {
	yes, no := true, false
	for _, c := range []struct {
		addr  string
		allow *bool
		token string
		warn  bool
	}{
		{"0.0.0.0:13334", nil, "", true},
		{"[::]:13334", nil, "", true},
		{"10.1.2.3:13334", nil, "", true},
		{"127.0.0.1:13334", nil, "", false},
		{"[::1]:13334", nil, "", false},
		{"0.0.0.0:13334", nil, "t", false}, // refused: nothing to warn about
		{"0.0.0.0:13334", &yes, "", false}, // decided
		{"0.0.0.0:13334", &no, "", false},
	} {
		got := rpcExposureWarning(c.addr, c.allow, rpcRefusesMutations(c.allow, c.token)) != ""
		if got != c.warn {
			t.Errorf("%s allow=%v token=%q: warn %v, want %v", c.addr, c.allow, c.token, got, c.warn)
		}
	}
	// Through the config file.
	cfg, err := LoadConfigFile(writeConfig(t, `{"rpc_allow_mutations": true}`))
	if err != nil || cfg.AppConfig().RPCAllowMutations == nil || !*cfg.AppConfig().RPCAllowMutations {
		t.Fatalf("rpc_allow_mutations true: %+v %v", cfg.RPCAllowMutations, err)
	}
	if cfg, err := LoadConfigFile(writeConfig(t, `{}`)); err != nil || cfg.RPCAllowMutations != nil {
		t.Fatalf("unset: %v %v", cfg.RPCAllowMutations, err)
	}
	if _, err := LoadConfigFile(writeConfig(t, `{"rpc_allow_mutations": "yes"}`)); err == nil {
		t.Fatal(`"yes" accepted`)
	}
}
