//go:build !cgo

package server

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// TestNoCgoRegistrationFailsClearly: a conductor built without cgo starts and serves, and
// registering a ZMQ service is refused with an error that says cgo is missing.
func TestNoCgoRegistrationFailsClearly(t *testing.T) {
	app := startApp(t, false)
	code, resp := msgpackPost(t, app, "/register", mp(regFields("tcp://127.0.0.1:1")...))
	if code == http.StatusOK || !strings.Contains(fmt.Sprint(resp), "ZMQ subscriptions need cgo") {
		t.Fatalf("register without cgo = %d %v; want a refusal naming cgo", code, resp)
	}
	if n := len(app.Service.Services()); n != 0 {
		t.Fatalf("%d services registered", n)
	}
}
