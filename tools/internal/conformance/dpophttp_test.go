package conformance_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/httpapi"
)

const dpopAPIKey = "tg_dpop_conformance_key"

type dpopKeys struct{}

func (dpopKeys) Verify(_ context.Context, s domain.Secret) (domain.KeyAccess, error) {
	if s.Reveal() == dpopAPIKey {
		return domain.KeyAccess{ID: 1, Name: "dpop"}, nil
	}
	return domain.KeyAccess{}, domain.ErrUnauthorized
}

// httpSurfaces drives the bound connection through the HTTP API: the bare
// token is 409 sender_constrained; /resource and the proxy sign a proof
// for every call; /dpop-proof hands out a proof the caller's own request
// is accepted with, only for URLs under the API base.
func (w *dpopWorld) httpSurfaces(t *testing.T) {
	base, _ := url.Parse(strings.TrimSuffix(w.api, "/resource"))
	srv := httptest.NewUnstartedServer(nil)
	s := httpapi.New(httpapi.Deps{Tokens: w.stacks[1], Keys: dpopKeys{}, APIBaseURL: base, Log: slog.New(slog.DiscardHandler),
		Edges: httpapi.Edges{Hosts: []string{srv.Listener.Addr().String()}, ProxyMaxBody: 1 << 20, Rate: 1e6, Burst: 1e6}})
	srv.Config.Handler = s.Handler()
	srv.Start()
	t.Cleanup(srv.Close)
	call := func(method, path, body string) (int, []byte) {
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+dpopAPIKey)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	if code, body := call("GET", "/connections/"+dpopConn+"/token", ""); code != http.StatusConflict || !bytes.Contains(body, []byte(`"sender_constrained"`)) {
		t.Errorf("GET /token of a bound connection: %d %s, want 409 sender_constrained", code, body)
	}
	for _, path := range []string{"/resource", "/proxy/resource?q=1"} {
		for range 3 {
			if code, body := call("GET", "/connections/"+dpopConn+path, ""); code != http.StatusOK {
				t.Errorf("GET %s through tokenguard: %d %s", path, code, body)
			}
		}
	}
	if code, _ := call("POST", "/connections/"+dpopConn+"/dpop-proof", `{"method":"GET","url":"http://elsewhere.example/resource"}`); code != http.StatusBadRequest {
		t.Errorf("a proof for a URL outside the API base: %d, want 400", code)
	}
	w.clientsUseProofs(t, srv.URL)
	nonce := ""
	for attempt := range 2 {
		code, body := call("POST", "/connections/"+dpopConn+"/dpop-proof", `{"method":"GET","url":"`+w.api+`?x=1","nonce":"`+nonce+`"}`)
		var p struct {
			AccessToken string `json:"access_token"`
			TokenType   string `json:"token_type"`
			DPoP        string `json:"dpop"`
			ExpiresAt   string `json:"expires_at"`
		}
		if code != http.StatusOK || json.Unmarshal(body, &p) != nil || p.TokenType != "DPoP" || p.DPoP == "" || p.AccessToken == "" || p.ExpiresAt == "" {
			t.Fatalf("dpop-proof: %d %s", code, body)
		}
		req, _ := http.NewRequest(http.MethodGet, w.api+"?x=1", nil)
		req.Header.Set("Authorization", "DPoP "+p.AccessToken)
		req.Header.Set("DPoP", p.DPoP)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusUnauthorized && resp.Header.Get("DPoP-Nonce") != "" && attempt == 0 {
			nonce = resp.Header.Get("DPoP-Nonce")
			continue
		}
		if resp.StatusCode != http.StatusOK {
			t.Errorf("the caller's own call with the handed-out proof: %d %s", resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
		}
		break
	}
}

// clientsUseProofs runs the Python and TypeScript clients against the
// server: for the bound connection they get a proof per request
// (authorization_headers / authorizationHeaders) and their own call to the
// API, which verifies it, is accepted (after one nonce round trip at most).
func (w *dpopWorld) clientsUseProofs(t *testing.T, server string) {
	root, _ := filepath.Abs("../../../clients")
	py := `import sys, urllib.request, urllib.error
sys.path.insert(0, sys.argv[1] + "/python")
from tokenguard import Tokenguard
tg = Tokenguard(sys.argv[2], sys.argv[3])
nonce = None
for _ in range(2):
    req = urllib.request.Request(sys.argv[4], headers=tg.authorization_headers("dpop-conn", "GET", sys.argv[4], nonce))
    try:
        with urllib.request.urlopen(req) as r:
            print(r.status); break
    except urllib.error.HTTPError as e:
        nonce = e.headers.get("DPoP-Nonce")
        if not nonce: print(e.code); break
`
	js := `const { Tokenguard } = await import("file://" + process.argv[1] + "/typescript/index.mjs");
const tg = new Tokenguard(process.argv[2], process.argv[3]);
let nonce;
for (let i = 0; i < 2; i++) {
  const res = await fetch(process.argv[4], { headers: await tg.authorizationHeaders("dpop-conn", "GET", process.argv[4], nonce) });
  nonce = res.headers.get("dpop-nonce");
  if (res.status !== 401 || !nonce || i === 1) { console.log(res.status); break; }
}
`
	for _, c := range []struct {
		name string
		cmd  *exec.Cmd
	}{
		{"python", exec.Command("python3", "-c", py, root, server, dpopAPIKey, w.api)},
		{"typescript", exec.Command("node", "--input-type=module", "-e", js, root, server, dpopAPIKey, w.api)},
	} {
		out, err := c.cmd.CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "200" {
			t.Errorf("%s client's own call with a proof from tokenguard: %v\n%s", c.name, err, out)
		}
	}
}
