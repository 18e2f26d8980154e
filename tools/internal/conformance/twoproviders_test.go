package conformance_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tokenguard/tokenguard/di"
	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/internal/sandbox"
	"github.com/tokenguard/tokenguard/tools/internal/conformance"
)

// The second server of the two-provider scenario: its own client.
const (
	otherClientID = "conformance-env"
	otherSecret   = "conformance-env-secret"
)

// twoProviders: connections of two independent servers are refreshed by
// the same processes, each at its own server. The server under test is a
// stored provider, registered as an operator registers one (tokenctl
// provider add, the client secret on stdin, auth style auto) and its
// grants imported with tokenctl import --provider; a second server, a
// fresh fosite sandbox with a client of its own that takes the client's
// credentials the other way, is the provider of the OAUTH_* settings.
// Three stacks (each one tokenguard.Tokens, one use case) call both
// servers' APIs through two connections of each until every connection
// was refreshed twice. Every call succeeds; neither server sees reuse;
// each server sees only its own client, and exactly as many refreshes as
// its connections' stored versions went up.
func twoProviders(r *run) conformance.Cell {
	const stored, cycles, callersPerConnection = "conformance-idp", 2, 6
	method, style, methodText := sandbox.ClientAuthPost, "params", "form body only"
	if r.s.style == "params" {
		method, style, methodText = sandbox.ClientAuthBasic, "header", "HTTP Basic only"
	}
	other := fositeClient(r.t, method, otherClientID, otherSecret)

	environ := []string{"DATABASE_URL=" + r.db}
	tokenctl := func(stdin string, args ...string) {
		r.t.Helper()
		var out, stderr strings.Builder
		if code := di.RunTokenctl(args, environ, strings.NewReader(stdin), &out, &stderr); code != 0 {
			r.fatalf("tokenctl %s %s: exit %d: %s", args[0], args[1], code, strings.TrimSpace(stderr.String()))
		}
	}
	// A token URL of its own (the proxy serves every path): the auth style
	// auto learns for it is not the one the scenarios before learned for
	// OAUTH_TOKEN_URL on this database.
	tokenURL := strings.TrimSuffix(r.s.proxyURL, "/token") + "/stored/token"
	tokenctl(r.s.oauth.ClientSecret+"\n", "provider", "add", "--name", stored,
		"--token-url", tokenURL, "--client-id", r.s.oauth.ClientID, "--api-base-url", r.s.api)

	e := newStacksFor(r, other, 3, style)
	markHere, ownHere := r.s.proxy.Mark(), r.s.ownReuse()
	markThere, ownThere := other.proxy.Mark(), other.ownReuse()

	var conns []*twoProvConn
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := 1; i <= 2; i++ {
		name := fmt.Sprintf("stored%d", i)
		tok, err := r.s.grant(ctx)
		if err != nil || tok.RefreshToken == "" {
			r.fatalf("first grant at the stored provider: %v (refresh token: %t)", err, err == nil && tok.RefreshToken != "")
		}
		js, _ := json.Marshal(tok)
		tokenctl(string(js), "import", "--connection", name, "--provider", stored)
		conns = append(conns, &twoProvConn{name: name, api: r.s.api, here: true, version: e.stored(name).Version})
		name = fmt.Sprintf("environment%d", i)
		conns = append(conns, &twoProvConn{name: name, api: other.api, version: e.connect(name).Version})
	}
	for _, c := range conns {
		if st := e.stored(c.name); (st.Provider == stored) != c.here {
			r.fatalf("%s names provider %q", c.name, st.Provider)
		}
	}

	calls, failures, firstFailure := callUntilRefreshed(ctx, e, conns, cycles, callersPerConnection)
	if firstFailure != nil {
		r.failf("%d of %d calls failed; first: %s", failures, calls, firstFailure)
	}

	// Each server's refreshes are exactly its own connections' new
	// versions, and carried its own client.
	var bumpedHere, bumpedThere int
	for _, c := range conns {
		st := e.stored(c.name)
		if st.Status != domain.StatusActive {
			r.failf("%s: status %s, want active", c.name, st.Status)
		}
		bumped := int(st.Version - c.version)
		if bumped < cycles && failures == 0 {
			r.failf("%s was refreshed %d times within 15s, want %d", c.name, bumped, cycles)
		}
		if c.here {
			bumpedHere += bumped
		} else {
			bumpedThere += bumped
		}
	}
	here, there := r.s.proxy.Answers(markHere), other.proxy.Answers(markThere)
	for _, s := range []struct {
		who      string
		answers  []conformance.Answer
		clientID string
	}{{"the stored provider", here, r.s.oauth.ClientID}, {"the OAUTH_* provider", there, otherClientID}} {
		for _, a := range s.answers {
			if a.ClientID != s.clientID {
				r.failf("%s received a request of client %q, want only %q", s.who, a.ClientID, s.clientID)
				break
			}
		}
	}
	ch, ct := conformance.Count(here), conformance.Count(there)
	ownDeltaHere, ownDeltaThere := r.s.ownReuse()-ownHere, other.ownReuse()-ownThere
	// Auth style auto at a form-only provider: an HTTP Basic probe, then
	// the form body, remembered. Refreshes of different connections run
	// side by side, so until the first one has remembered the answer each
	// may probe: at least one probe, at most one per connection here.
	minProbes, maxProbes := 0, 0
	if !r.s.basicOK {
		minProbes = 1
		for _, c := range conns {
			if c.here {
				maxProbes++
			}
		}
	}
	if ch.Refreshed != bumpedHere || ch.InvalidGrant != 0 || ch.Other != 0 || ch.InvalidClient < minProbes || ch.InvalidClient > maxProbes || ownDeltaHere != 0 {
		r.failf("stored provider: %+v, server counted %d reuse; want %d refreshes (its connections' new versions), no error but %d to %d invalid_client",
			ch, ownDeltaHere, bumpedHere, minProbes, maxProbes)
	}
	if ct.Refreshed != bumpedThere || ct.InvalidGrant != 0 || ct.Other != 0 || ct.InvalidClient != 0 || ownDeltaThere != 0 {
		r.failf("OAUTH_* provider: %+v, server counted %d reuse; want %d refreshes (its connections' new versions), no error",
			ct, ownDeltaThere, bumpedThere)
	}
	return conformance.Cell{Refreshes: ch.Refreshed, Reuse: reuse(ch, ownDeltaHere),
		Note: fmt.Sprintf("stored provider (tokenctl provider add, auth style auto: %d × invalid_client) beside a fosite sandbox (%s, another client) as OAUTH_*; "+
			"3 stacks, %d callers on 2 + 2 connections, %d of %d calls failed; refreshes here %d, there %d, reuse there %d; each server saw only its own client",
			ch.InvalidClient, methodText, callersPerConnection*len(conns), failures, calls, ch.Refreshed, ct.Refreshed, reuse(ct, ownDeltaThere))}
}

// twoProvConn is a connection of twoProviders, at the stored provider
// (here: the server under test's) or at the OAUTH_* one.
type twoProvConn struct {
	name, api string
	here      bool // a connection of the server under test
	version   int64
}

// callUntilRefreshed calls every connection's API from every stack until
// each connection was refreshed cycles times (at most 15 s, or until a
// call fails).
func callUntilRefreshed(ctx context.Context, e *env, conns []*twoProvConn, cycles int64, callersPerConnection int) (calls, failures int64, firstFailure any) {
	var nCalls, nFailures atomic.Int64
	var first atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, st := range e.stacks {
		for i := range callersPerConnection / len(e.stacks) * len(conns) {
			c := conns[i%len(conns)]
			client := st.tokens.Guard.Client(ctx, c.name)
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					case <-time.After(20 * time.Millisecond):
					}
					code, err := get(ctx, client, c.api+"/resource")
					nCalls.Add(1)
					if err != nil || code != http.StatusOK {
						nFailures.Add(1)
						first.CompareAndSwap(nil, fmt.Sprintf("%s: answered %d, %v", c.name, code, err))
					}
				}
			})
		}
	}
	// The load lasts until every connection was refreshed cycles times.
	refreshed := func() bool {
		for _, c := range conns {
			if e.stored(c.name).Version < c.version+cycles {
				return false
			}
		}
		return true
	}
	deadline := time.Now().Add(15 * time.Second)
	for !refreshed() && time.Now().Before(deadline) && nFailures.Load() == 0 {
		time.Sleep(50 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	return nCalls.Load(), nFailures.Load(), first.Load()
}

// get calls url with client and returns the status.
func get(ctx context.Context, client *http.Client, url string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}
