package httpapi_test

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"testing"
	"time"
)

// TestProxyHostilePaths sends every path of testdata/hostile_paths.json
// (the table the clients' tests share) through the proxy of a real server:
// none reaches the upstream, each accepted one does (the control). Findings
// 5 and 6 of the review: TRACE and CONNECT are 405 and forward nothing;
// GET is forwarded (the control).
func TestProxyHostilePaths(t *testing.T) {
	r := newRig(t, time.Hour)
	raw, err := os.ReadFile("../../testdata/hostile_paths.json")
	if err != nil {
		t.Fatal(err)
	}
	var tab struct{ Refused, Accepted []string }
	if err := json.Unmarshal(raw, &tab); err != nil {
		t.Fatal(err)
	}
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	sendTo := func(method, connection, p string) int {
		t.Helper()
		req, err := http.NewRequest(method, r.server.URL, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.URL.Opaque = "/connections/" + connection + "/proxy/" + p // as written, not re-encoded
		req.Header.Set("Authorization", "Bearer "+apiKey)
		resp, err := noRedirect.Do(req)
		if err != nil {
			return 0 // refused by the HTTP layer: nothing was forwarded either
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	send := func(method, p string) int { return sendTo(method, "acme", p) }
	forwarded := func() bool {
		select {
		case <-r.seen:
			<-r.bodies
			return true
		default:
			return false
		}
	}
	for _, p := range tab.Refused {
		if code := send("GET", p); code == http.StatusCreated || forwarded() {
			t.Errorf("hostile path %q: %d, forwarded to the upstream", p, code)
		}
	}
	for _, p := range tab.Accepted {
		if code := send("GET", p); code != http.StatusCreated || !forwarded() {
			t.Errorf("control: path %q: %d, not forwarded", p, code)
		}
	}
	for _, m := range []string{"TRACE", "CONNECT", "PROPFIND"} {
		if code := send(m, "echo"); code != http.StatusMethodNotAllowed || forwarded() {
			t.Errorf("%s through the proxy: %d, want 405 and nothing forwarded", m, code)
		}
	}
	// Before the token is looked up: a connection that has none is 405
	// too, not 404 (the control: GET is 404).
	for _, m := range []string{"TRACE", "CONNECT"} {
		if code := sendTo(m, "nosuch", "echo"); code != http.StatusMethodNotAllowed {
			t.Errorf("%s through the proxy of a connection without a token: %d, want 405 before the token lookup", m, code)
		}
	}
	if code := sendTo("GET", "nosuch", "echo"); code != http.StatusNotFound {
		t.Errorf("control: GET through the proxy of a connection without a token: %d, want 404", code)
	}
	for _, m := range []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"} {
		if code := send(m, "echo"); code != http.StatusCreated || !forwarded() {
			t.Errorf("control: %s through the proxy: %d, want forwarded", m, code)
		}
	}
}
