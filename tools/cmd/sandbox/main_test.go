package main

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/di"
	"github.com/tokenguard/tokenguard/infra/postgres"
	"github.com/tokenguard/tokenguard/infra/tokencrypt"
	"github.com/tokenguard/tokenguard/internal/testdb"
	"github.com/tokenguard/tokenguard/internal/waitfor"
	"github.com/tokenguard/tokenguard/repository"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// refresh redeems rt at the sandbox with the client's credentials in the
// Basic header or the form body, and returns the status and the answer.
func refresh(t *testing.T, base, clientID, rt string, basic bool) (int, map[string]any) {
	t.Helper()
	form := url.Values{"grant_type": {"refresh_token"}, "refresh_token": {rt}}
	if !basic {
		form.Set("client_id", clientID)
		form.Set("client_secret", defaultSecret)
	}
	req, _ := http.NewRequest(http.MethodPost, base+"/oauth2/token", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if basic {
		req.SetBasicAuth(clientID, defaultSecret)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body := map[string]any{}
	_ = json.NewDecoder(resp.Body).Decode(&body)
	return resp.StatusCode, body
}

// The quirk flags make the sandbox a provider that takes the client only
// in the form body and never says expires_in; its banner gives the
// settings that fit, and the tokenctl provider add and import --provider
// commands it prints store a connection of it.
func TestQuirkFlagsAndTheBannerCommands(t *testing.T) {
	t.Setenv("SANDBOX_CLIENT_SECRET", "")
	var stdout, stderr strings.Builder
	sb, code := start([]string{"--addr", "127.0.0.1:0", "--client-id", "second", "--auth-style", "params",
		"--omit-expires-in", "--access-token-lifetime", "2s"}, &stdout, &stderr)
	if sb == nil {
		t.Fatalf("start: exit %d: %s", code, stderr.String())
	}
	defer sb.Close()
	banner := stderr.String()
	for _, want := range []string{"OAUTH_CLIENT_ID=second ", "OAUTH_AUTH_STYLE=params TOKEN_DEFAULT_LIFETIME=2s",
		"--auth-style params --default-lifetime 2s", "bin/sandbox grant --url " + sb.URL + " --client-id second |"} {
		if !strings.Contains(banner, want) {
			t.Errorf("the banner lacks %q:\n%s", want, banner)
		}
	}

	var tokJSON, grantErr strings.Builder
	if code := grant([]string{"--url", sb.URL, "--client-id", "second"}, &tokJSON, &grantErr); code != 0 {
		t.Fatalf("grant: exit %d: %s", code, grantErr.String())
	}
	var tok oauth2.Token
	if err := json.Unmarshal([]byte(tokJSON.String()), &tok); err != nil || tok.RefreshToken == "" || !tok.Expiry.IsZero() {
		t.Fatalf("grant printed a token with expiry %v (want none), refresh token %t: %v", tok.Expiry, tok.RefreshToken != "", err)
	}

	// Follow the banner: tokenctl provider add (secret on stdin), then the
	// grant into tokenctl import --provider.
	db := testdb.New(t)
	environ := []string{"DATABASE_URL=" + db}
	tokenctl := func(stdin string, args ...string) string {
		t.Helper()
		var out, errOut strings.Builder
		if code := di.RunTokenctl(args, environ, strings.NewReader(stdin), &out, &errOut); code != 0 {
			t.Fatalf("tokenctl %v: exit %d: %s", args, code, errOut.String())
		}
		return out.String()
	}
	var add []string
	for line := range strings.Lines(banner) {
		if _, cmd, ok := strings.Cut(line, "| bin/tokenctl provider add "); ok {
			add = append([]string{"provider", "add"}, strings.Fields(cmd)...)
		}
	}
	if add == nil {
		t.Fatalf("no tokenctl provider add in the banner:\n%s", banner)
	}
	tokenctl(defaultSecret+"\n", add...)
	tokenctl(tokJSON.String(), "import", "--connection", "globex", "--provider", "sandbox")
	gdb, err := postgres.Open(context.Background(), db, postgres.Pool{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer postgres.Close(gdb)
	p, err := repository.NewProviderRepository(gdb, tokencrypt.Plaintext{}).Get(context.Background(), "sandbox")
	if err != nil || p.AuthStyle != "params" || p.DefaultLifetime.String() != "2s" || p.ClientID != "second" || p.APIBaseURL != sb.URL {
		t.Fatalf("stored provider %+v, %v", p, err)
	}
	stored, err := repository.NewTokenRepository(gdb, tokencrypt.Plaintext{}).Get(context.Background(), "globex")
	if err != nil || stored.Provider != "sandbox" {
		t.Fatalf("connection globex: provider %q, %v", stored.Provider, err)
	}

	// The token endpoint: HTTP Basic refused without spending the refresh
	// token, the form body answered without expires_in.
	if code, _ := refresh(t, sb.URL, "second", tok.RefreshToken, true); code != http.StatusUnauthorized {
		t.Errorf("HTTP Basic: %d, want 401", code)
	}
	code, body := refresh(t, sb.URL, "second", tok.RefreshToken, false)
	if _, has := body["expires_in"]; code != http.StatusOK || has {
		t.Errorf("form body: %d, expires_in present: %t", code, has)
	}
}

func TestDefaultsAndBadFlags(t *testing.T) {
	var stdout, stderr strings.Builder
	sb, _ := start([]string{"--addr", "127.0.0.1:0"}, &stdout, &stderr)
	if sb == nil {
		t.Fatal(stderr.String())
	}
	defer sb.Close()
	if strings.Contains(stderr.String(), "OAUTH_AUTH_STYLE") || strings.Contains(stderr.String(), "TOKEN_DEFAULT_LIFETIME") ||
		!strings.Contains(stderr.String(), "bin/sandbox grant --url "+sb.URL+" |") {
		t.Errorf("a sandbox without quirks asks for settings:\n%s", stderr.String())
	}
	var tok strings.Builder
	if code := grant([]string{"--url", sb.URL}, &tok, &stderr); code != 0 {
		t.Fatal(stderr.String())
	}
	var granted oauth2.Token
	_ = json.Unmarshal([]byte(tok.String()), &granted)
	for _, basic := range []bool{true, false} {
		code, body := refresh(t, sb.URL, defaultClientID, granted.RefreshToken, basic)
		if _, has := body["expires_in"]; code != http.StatusOK || !has {
			t.Errorf("basic %t: %d, expires_in present: %t", basic, code, has)
		}
		granted.RefreshToken, _ = body["refresh_token"].(string)
	}
	stderr.Reset()
	if sb, code := start([]string{"--addr", "127.0.0.1:0", "--auth-style", "basic"}, &stdout, &stderr); sb != nil || code != 2 ||
		!strings.Contains(stderr.String(), "want header, params or both") {
		t.Errorf("--auth-style basic: exit %d: %s", code, stderr.String())
	}
}

// --like smaregi serves the token endpoint at the tenant's URL, which the
// banner and grant use; --dead-grant words a dead grant as GitHub does;
// --lose-answer-every processes a refresh and never answers it.
func TestBehaviourFlags(t *testing.T) {
	var stdout, stderr strings.Builder
	sb, code := start([]string{"--addr", "127.0.0.1:0", "--like", "smaregi", "--dead-grant", "200:error:bad_refresh_token", "--lose-answer-every", "2"}, &stdout, &stderr)
	if sb == nil {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	defer sb.Close()
	tokenURL := sb.URL + "/t/tenant-1/oauth2/token"
	if !strings.Contains(stderr.String(), "OAUTH_TOKEN_URL="+tokenURL) || !strings.Contains(stderr.String(), "--tenant tenant-1") {
		t.Fatalf("banner without the tenant's token URL:\n%s", stderr.String())
	}
	var tok strings.Builder
	if code := grant([]string{"--url", sb.URL, "--tenant", "tenant-1"}, &tok, &stderr); code != 0 {
		t.Fatal(stderr.String())
	}
	if s := sb.Stats(); s.CodeExchanges != 1 {
		t.Fatalf("stats %+v", s)
	}
	for _, bad := range [][]string{{"--like", "nope"}, {"--dead-grant", "200:error"}, {"--extra-fields", "x"}, {"--lose-answer-every", "-1"}} {
		stderr.Reset()
		if sb, code := start(append([]string{"--addr", "127.0.0.1:0"}, bad...), &stdout, &stderr); sb != nil || code != 2 {
			t.Errorf("%v: exit %d: %s", bad, code, stderr.String())
		}
	}
}

// --hang-for holds every refresh unanswered for a while from start (the
// client times out, the refresh token is not spent: the same one works
// afterwards); --token-latency answers every refresh that late.
func TestLatencyAndHangFlags(t *testing.T) {
	var stdout, stderr strings.Builder
	sb, code := start([]string{"--addr", "127.0.0.1:0", "--hang-for", "2s", "--token-latency", "300ms"}, &stdout, &stderr)
	if sb == nil {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	defer sb.Close()
	var out strings.Builder
	if code := grant([]string{"--url", sb.URL}, &out, &stderr); code != 0 {
		t.Fatal(stderr.String())
	}
	var tok oauth2.Token
	if err := json.Unmarshal([]byte(out.String()), &tok); err != nil {
		t.Fatal(err)
	}
	form := url.Values{"grant_type": {"refresh_token"}, "refresh_token": {tok.RefreshToken}}
	try := func() (int, time.Duration, error) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, sb.URL+"/oauth2/token", strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.SetBasicAuth(defaultClientID, defaultSecret)
		began := time.Now()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, 0, err
		}
		defer resp.Body.Close()
		return resp.StatusCode, time.Since(began), nil
	}
	if status, _, err := try(); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a refresh while hanging: status %d, %v; want no answer (the client's deadline)", status, err)
	}
	var took time.Duration
	waitfor.Until(t, 30*time.Second, "the same refresh token answered once the hang is over", func() bool {
		status, d, err := try()
		took = d
		return err == nil && status == http.StatusOK
	})
	if took < 300*time.Millisecond {
		t.Errorf("the refresh was answered in %v, before --token-latency (300ms)", took)
	}
	if s := sb.Stats(); s.RefreshReuse != 0 || s.Refreshes != 1 {
		t.Errorf("stats %+v: want one refresh, no reuse", s)
	}
	for _, bad := range [][]string{{"--hang-for", "-1s"}, {"--token-latency", "-1s"}} {
		if sb, code := start(append([]string{"--addr", "127.0.0.1:0"}, bad...), &stdout, &stderr); sb != nil || code != 2 {
			t.Errorf("%v: exit %d", bad, code)
		}
	}
}

// --scopes, --refresh-scope and --omit-refresh-scope: sandbox grant asks
// for and prints the scopes granted; a refresh grants only those of
// --refresh-scope (the rotated refresh token carries only those too), or
// answers without scope; without either switch the refresh names the
// grant's scopes.
func TestScopeFlags(t *testing.T) {
	for _, c := range []struct {
		flags      []string
		want       []string // the refresh answers' scope, twice
		wantNoneAt bool     // the refresh answers name no scope
	}{
		{[]string{"--refresh-scope", "api"}, []string{"api", "api"}, false},
		{[]string{"--refresh-scope", ""}, []string{"", ""}, false},
		{[]string{"--omit-refresh-scope"}, nil, true},
		{nil, []string{"api read", "api read"}, false},
	} {
		t.Run(strings.Join(c.flags, " "), func(t *testing.T) {
			var stdout, stderr strings.Builder
			sb, code := start(append([]string{"--addr", "127.0.0.1:0", "--scopes", "api read"}, c.flags...), &stdout, &stderr)
			if sb == nil {
				t.Fatalf("exit %d: %s", code, stderr.String())
			}
			defer sb.Close()
			if !strings.Contains(stderr.String(), "OAUTH_SCOPES='api read'") || !strings.Contains(stderr.String(), "grant --url "+sb.URL+" --scope 'api read'") {
				t.Errorf("banner without the scopes:\n%s", stderr.String())
			}
			var out strings.Builder
			if code := grant([]string{"--url", sb.URL, "--scope", "api read"}, &out, &stderr); code != 0 {
				t.Fatal(stderr.String())
			}
			var tok struct {
				RefreshToken string `json:"refresh_token"`
				Scope        string `json:"scope"`
			}
			if err := json.Unmarshal([]byte(out.String()), &tok); err != nil || tok.Scope != "api read" {
				t.Fatalf("sandbox grant printed %s (%v), want scope \"api read\"", out.String(), err)
			}
			rt := tok.RefreshToken
			for i := range 2 {
				status, body := refresh(t, sb.URL, defaultClientID, rt, true)
				scope, named := body["scope"]
				if status != http.StatusOK || named == c.wantNoneAt || (named && scope != c.want[i]) {
					t.Errorf("refresh %d: %d scope %v (named %t)", i+1, status, scope, named)
				}
				rt, _ = body["refresh_token"].(string)
			}
		})
	}
}
