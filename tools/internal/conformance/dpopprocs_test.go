package conformance_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/oauth2"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/tokenguard/tokenguard"
)

// sharerEnv carries a sharer process's orders (sharerSpec, JSON): set,
// the test binary runs as one of the processes that share the bound
// connection (TestDPoPSharerProcess) instead of as the test.
const sharerEnv = "TOKENGUARD_DPOP_SHARER"

// sharerResult prefixes the line a sharer process prints its counts on.
const sharerResult = "dpop-sharer-result "

type sharerSpec struct {
	DSN, AuthURL, TokenURL, ClientID, API string
	Index                                 int
	Start, End                            time.Time // the load's window, the same for every process
}

// sharerCounts are one process's calls to the resource server.
type sharerCounts struct {
	Calls, Failures int
	FirstFailure    string `json:",omitempty"`
}

func (c sharerCounts) String() string { return fmt.Sprintf("%d/%d failed", c.Failures, c.Calls) }

// nonceStep is how often oidc-provider makes a new DPoP nonce (its
// ServerChallenge: a step of 60 s of the clock).
const nonceStep = time.Minute

// loadFromProcesses runs n sharer processes (this test binary, re-run as
// TestDPoPSharerProcess), each a stack of its own with its own pool,
// cache, nonces and the key opened from the store, calling the resource
// server through Client for d from the same start. The window holds one
// of the authorization server's nonce steps, so that its nonce changes
// under load; the processes reach its token endpoint through a proxy
// that returns the nonces it handed out.
func (w *dpopWorld) loadFromProcesses(t *testing.T, n int, d time.Duration) ([]sharerCounts, time.Duration, []string) {
	t.Helper()
	start := time.Now().Add(5 * time.Second) // time for every process to start and be ready
	step := start.Truncate(nonceStep).Add(nonceStep)
	if step.Sub(start) < d/4 { // too early for a refresh to have learned the nonce before
		step = step.Add(nonceStep)
	}
	if step.Sub(start) > d-d/4 {
		start = step.Add(-d / 2)
	}
	tokenURL, nonces := w.nonceRecorder(t)
	spec := sharerSpec{DSN: w.dsn, AuthURL: w.cfg.Endpoint.AuthURL, TokenURL: tokenURL, ClientID: w.cfg.ClientID,
		API: w.api, Start: start, End: start.Add(d)}
	counts := make([]sharerCounts, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		spec.Index = i
		orders, _ := json.Marshal(spec)
		ctx, cancel := context.WithTimeout(context.Background(), time.Until(spec.End)+time.Minute)
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run", "^TestDPoPSharerProcess$", "-test.count", "1")
		cmd.Env = append(os.Environ(), sharerEnv+"="+string(orders))
		var out, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &stderr
		if err := cmd.Start(); err != nil {
			cancel()
			t.Fatalf("sharer process %d: %v", i, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer cancel()
			err := cmd.Wait()
			sc := bufio.NewScanner(&out)
			for sc.Scan() {
				if line, ok := strings.CutPrefix(sc.Text(), sharerResult); ok {
					if json.Unmarshal([]byte(line), &counts[i]) == nil && err == nil {
						return
					}
				}
			}
			errs[i] = fmt.Errorf("sharer process %d (pid %d): %v, no counts\n%s%s", i, cmd.Process.Pid, err, out.String(), stderr.String())
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	for i, c := range counts {
		if c.FirstFailure != "" {
			t.Logf("process %d: first failed call: %s", i, c.FirstFailure)
		}
	}
	return counts, d, nonces()
}

// nonceRecorder is a reverse proxy to the authorization server's token
// endpoint (the Host header kept, so proofs name the proxy's URL, as the
// server checks htu against its own view of the request) and the distinct
// DPoP nonces the server handed out through it.
func (w *dpopWorld) nonceRecorder(t *testing.T) (tokenURL string, nonces func() []string) {
	target, err := url.Parse(w.d.Token)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []string
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(&url.URL{Scheme: target.Scheme, Host: target.Host})
			r.Out.Host = r.In.Host
		},
		ModifyResponse: func(resp *http.Response) error {
			if n := resp.Header.Get("DPoP-Nonce"); n != "" {
				mu.Lock()
				if !slices.Contains(seen, n) {
					seen = append(seen, n)
				}
				mu.Unlock()
			}
			return nil
		},
	}
	srv := httptest.NewServer(rp)
	t.Cleanup(srv.Close)
	return srv.URL + target.Path, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(seen)
	}
}

// TestDPoPSharerProcess is one of the processes of
// TestDPoPBoundGrantSharedByThreeProcesses; run alone it skips.
func TestDPoPSharerProcess(t *testing.T) {
	orders := os.Getenv(sharerEnv)
	if orders == "" {
		t.Skip("a sharer process of TestDPoPBoundGrantSharedByThreeProcesses, run by it")
	}
	var s sharerSpec
	if err := json.Unmarshal([]byte(orders), &s); err != nil {
		t.Fatal(err)
	}
	db, err := gorm.Open(postgres.Open(s.DSN), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	sqlDB, _ := db.DB()
	sqlDB.SetMaxOpenConns(4)
	defer sqlDB.Close()
	cfg := &oauth2.Config{ClientID: s.ClientID, RedirectURL: redirectURI, Scopes: []string{"openid", "offline_access"},
		Endpoint: oauth2.Endpoint{AuthURL: s.AuthURL, TokenURL: s.TokenURL, AuthStyle: oauth2.AuthStyleInParams}}
	tg, err := tokenguard.New(db, cfg, tokenguard.WithDPoP(), tokenguard.WithSkew(skew),
		tokenguard.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = tg.Run(ctx) }()
	defer func() { _ = tg.Close(context.Background()); cancel(); <-done }()
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	if err := tg.WaitReady(wctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(s.Start))

	var ok, bad atomic.Int64
	var first atomic.Value
	var wg sync.WaitGroup
	for g := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			hc := tg.Client(context.Background(), dpopConn)
			for n := 0; time.Now().Before(s.End); n++ {
				resp, err := hc.Get(fmt.Sprintf("%s?process=%d&g=%d&n=%d", s.API, s.Index, g, n))
				if err != nil {
					bad.Add(1)
					first.CompareAndSwap(nil, err.Error())
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					bad.Add(1)
					first.CompareAndSwap(nil, fmt.Sprintf("%d %s", resp.StatusCode, resp.Header.Get("WWW-Authenticate")))
					continue
				}
				ok.Add(1)
				time.Sleep(20 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	c := sharerCounts{Calls: int(ok.Load() + bad.Load()), Failures: int(bad.Load())}
	c.FirstFailure, _ = first.Load().(string)
	line, _ := json.Marshal(c)
	fmt.Println(sharerResult + string(line))
}
