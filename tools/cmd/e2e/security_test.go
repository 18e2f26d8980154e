package e2e

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokenguard/tokenguard/internal/waitfor"
)

// receiver is a webhook endpoint that can go down and come back on the
// same address. It checks every signature the way docs/operations.md tells
// receivers to, and counts the deliveries it acknowledged per event id.
type receiver struct {
	t      *testing.T
	secret string
	addr   string

	mu     sync.Mutex
	srv    *http.Server
	acked  map[string]int // event id → 2xx answers given
	events []webhookEvent // in order of first acknowledgement
	bad    []string
	bodies []string
}

type webhookEvent struct {
	ID         string          `json:"id"`
	Type       string          `json:"type"`
	Connection string          `json:"connection"`
	OccurredAt time.Time       `json:"occurred_at"`
	Data       json.RawMessage `json:"data"`
}

func newReceiver(t *testing.T, secret string) *receiver {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &receiver{t: t, secret: secret, addr: ln.Addr().String(), acked: map[string]int{}}
	r.serve(ln)
	t.Cleanup(r.down)
	return r
}

func (r *receiver) url() string { return "http://" + r.addr + "/hooks/tokenguard" }

func (r *receiver) serve(ln net.Listener) {
	srv := &http.Server{Handler: r, ReadHeaderTimeout: 5 * time.Second}
	r.mu.Lock()
	r.srv = srv
	r.mu.Unlock()
	go func() { _ = srv.Serve(ln) }()
}

// down closes the listener: deliveries see "connection refused".
func (r *receiver) down() {
	r.mu.Lock()
	srv := r.srv
	r.srv = nil
	r.mu.Unlock()
	if srv != nil {
		_ = srv.Close()
	}
}

// up listens again on the same address.
func (r *receiver) up() {
	var ln net.Listener
	var err error
	for range 50 {
		if ln, err = net.Listen("tcp", r.addr); err == nil {
			r.serve(ln)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	r.t.Fatalf("receiver cannot listen on %s again: %v", r.addr, err)
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(req.Body, 1<<20))
	r.mu.Lock()
	defer r.mu.Unlock()
	r.bodies = append(r.bodies, req.Header.Get("Tokenguard-Signature")+" "+string(body))
	if err := verifySignature(r.secret, req.Header.Get("Tokenguard-Signature"), body, time.Now()); err != nil {
		r.bad = append(r.bad, err.Error())
		http.Error(w, "bad signature", http.StatusUnauthorized)
		return
	}
	var e webhookEvent
	if json.Unmarshal(body, &e) != nil || e.ID == "" || e.ID != req.Header.Get("Tokenguard-Event-Id") {
		r.bad = append(r.bad, "malformed event: "+string(body))
		http.Error(w, "bad event", http.StatusBadRequest)
		return
	}
	if r.acked[e.ID] == 0 {
		r.events = append(r.events, e)
	}
	r.acked[e.ID]++
	w.WriteHeader(http.StatusNoContent)
}

// verifySignature is docs/operations.md's receiver snippet: Tokenguard-Signature
// is "t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">"; reject
// signatures older than five minutes.
func verifySignature(secret, header string, body []byte, now time.Time) error {
	var ts, sig string
	for _, part := range strings.Split(header, ",") {
		k, v, _ := strings.Cut(part, "=")
		switch k {
		case "t":
			ts = v
		case "v1":
			sig = v
		}
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || sig == "" {
		return errors.New("malformed Tokenguard-Signature")
	}
	if d := now.Sub(time.Unix(sec, 0)); d > 5*time.Minute || d < -5*time.Minute {
		return errors.New("stale signature")
	}
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(ts + "."))
	mac.Write(body)
	want := hex.EncodeToString(mac.Sum(nil))
	if !hmac.Equal([]byte(sig), []byte(want)) {
		return errors.New("signature mismatch")
	}
	return nil
}

func (r *receiver) snapshot() (events []webhookEvent, acked map[string]int, bad []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	acked = map[string]int{}
	for k, v := range r.acked {
		acked[k] = v
	}
	return slices.Clone(r.events), acked, slices.Clone(r.bad)
}

// browser follows a connect URL like a person at the sandbox would, in a
// browser of their own (personAt), pressing the consent page's button;
// it returns the last answer.
func browser(t *testing.T, s *stack, connectURL, subject, scopes string) (*http.Response, string) {
	t.Helper()
	return press(t, personAt(s, subject, scopes), connectURL)
}

// storedRow is the whole tokens row of a connection, as text.
func storedRow(t *testing.T, dbURL, name string) string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var row string
	if err := conn.QueryRow(ctx, `SELECT row_to_json(t)::text FROM tokenguard_tokens t JOIN tokenguard_connections c ON c.id = t.connection_id WHERE c.name = $1`, name).Scan(&row); err != nil {
		t.Fatal(err)
	}
	return row
}

func sql(t *testing.T, dbURL, q string, args ...any) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, q, args...); err != nil {
		t.Fatal(err)
	}
}

// testSecurity is issue 14's end-to-end check with real processes: API
// keys on every protected route, connect sessions single-use and expiring,
// an attacker's consent refused with the stored grant untouched, an
// allowed account change with narrower scopes, and webhooks that reach a
// receiver which was down (and a worker that was killed) exactly once per
// event id.
func testSecurity(t *testing.T, bin string) {
	const secret = "whsec-e2e-0123456789abcdef"
	rcv := newReceiver(t, secret)
	s := newStack(t, bin, stackOpts{lifetime: lifetime, skew: skew, scopes: []string{"api", "write"}, extraEnv: []string{
		"OAUTH_SCOPES=api,write",
		"WEBHOOK_URL=" + rcv.url(),
		"WEBHOOK_SECRET=" + secret,
		"CONNECT_RETURN_URLS=http://app.example/settings/",
		"WORKER_JOB_TIMEOUT=5s",
	}})
	s.env = append(s.env, "OAUTH_USERINFO_URL="+s.sb.URL+"/userinfo")
	s.migrate()
	server := s.start("server")
	s.waitHealthy(server)
	worker := s.start("worker")

	checkKeysRequired(t, s)
	checkOwnerConnects(t, s)
	checkAttackerRefused(t, s)
	checkAllowedAccountChange(t, s, bin, rcv)

	// The receiver goes down; the grant dies and recovers meanwhile,
	// and the worker is killed and restarted.
	rcv.down()
	s.sb.RevokeAll()
	time.Sleep(lifetime - skew)
	expectJSONError(t, s, http.MethodGet, "/connections/acme/resource", http.StatusConflict, "needs_reauth")
	time.Sleep(1500 * time.Millisecond) // the worker queues the event and fails to deliver it
	worker.Kill()
	<-worker.Done()
	s.connectVia("acme", "", "new-owner", "")
	worker = s.start("worker")
	time.Sleep(3 * time.Second) // the new worker fails too
	rcv.up()
	waitfor.Until(t, 60*time.Second, "every event delivered", func() bool {
		ev, _, _ := rcv.snapshot()
		return len(ev) >= 4
	})

	time.Sleep(2 * time.Second) // room for a duplicate, if there were one
	s.stop(worker)
	s.stop(server)

	checkWebhooksOnce(t, s, rcv)
}

// checkKeysRequired: without a valid key every protected route answers
// 401; a foreign Host (DNS rebinding) and a return_to outside
// CONNECT_RETURN_URLS are refused.
func checkKeysRequired(t *testing.T, s *stack) {
	protected := [][2]string{
		{http.MethodGet, "/connections/acme/resource"},
		{http.MethodPost, "/connections/acme/events"},
		{http.MethodPost, "/connect-sessions"},
		{http.MethodGet, "/metrics"},
	}
	for _, key := range []string{"", "tgk_" + strings.Repeat("A", 43), s.key + "x"} {
		for _, r := range protected {
			expectJSONError401(t, s, key, r[0], r[1])
		}
	}
	for _, q := range []string{"", "?connection=acme", "?session=tgs_forged"} {
		if code, _ := s.doWith("", http.MethodGet, "/oauth/connect"+q, ""); code != http.StatusUnauthorized {
			t.Errorf("GET /oauth/connect%s without a valid session: %d, want 401", q, code)
		}
	}
	if code, _ := s.doWith("", http.MethodGet, "/healthz", ""); code != http.StatusOK {
		t.Errorf("healthz without a key: %d", code)
	}
	// DNS rebinding: a foreign name pointing at the server is refused.
	req, _ := http.NewRequest(http.MethodGet, "http://"+s.addr+"/metrics", nil)
	req.Host = "rebind.attacker.example"
	req.Header.Set("Authorization", "Bearer "+s.key)
	if resp, err := s.client.Do(req); err != nil || resp.StatusCode != http.StatusMisdirectedRequest {
		t.Errorf("foreign Host: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	if code, _ := s.do(http.MethodPost, "/connect-sessions", `{"connection":"acme","return_to":"https://evil.example/settings/"}`); code != http.StatusBadRequest {
		t.Errorf("return_to outside CONNECT_RETURN_URLS: %d, want 400", code)
	}
}

// checkOwnerConnects: the owner's consent comes back pending and the
// backend redeems it; replayed and expired sessions are refused.
func checkOwnerConnects(t *testing.T, s *stack) {
	ownerURL := s.connectSession("acme", "")
	resp, body := browser(t, s, ownerURL, "", "")
	back := returned(resp)
	if back == nil || back.Query().Get("status") != "pending" || strings.Contains(body, "ory_") {
		t.Fatalf("owner's consent: %s Location %q %s", resp.Status, resp.Header.Get("Location"), body)
	}
	if code, r, raw := s.redeem(s.key, back.Query().Get("result")); code != http.StatusOK || r.Account != "sandbox-user" || strings.Join(r.Scopes, " ") != "api write" {
		t.Fatalf("redeem the owner's result: %d %s", code, raw)
	}
	if code, body := s.do(http.MethodGet, "/connections/acme/resource", ""); code != http.StatusOK || !strings.Contains(body, `"subject":"sandbox-user"`) {
		t.Fatalf("resource after connecting: %d %s", code, body)
	}
	// Replayed and expired sessions are refused.
	if resp, _ := browser(t, s, ownerURL, "", ""); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("replayed session: %s, want 401", resp.Status)
	}
	expired := s.connectSession("acme", "")
	sql(t, s.dbURL, "UPDATE tokenguard_connect_sessions SET expires_at = now() - interval '1 second' WHERE id = (SELECT max(id) FROM tokenguard_connect_sessions)")
	if resp, body := browser(t, s, expired, "", ""); resp.StatusCode != http.StatusUnauthorized || strings.HasPrefix(body, "{") {
		t.Errorf("expired session: %s %q, want 401 with a page", resp.Status, body)
	}
}

// checkAttackerRefused: the attacker's consent is refused at the
// redemption; the stored grant is unchanged byte for byte (version
// included).
func checkAttackerRefused(t *testing.T, s *stack) {
	before := storedRow(t, s.dbURL, "acme")
	resp, _ := browser(t, s, s.connectSession("acme", ""), "attacker", "")
	if back := returned(resp); back == nil || back.Query().Get("status") != "pending" {
		t.Fatalf("attacker's consent: %s Location %q", resp.Status, resp.Header.Get("Location"))
	} else if code, r, raw := s.redeem(s.key, back.Query().Get("result")); code != http.StatusConflict || r.Code != "account_mismatch" {
		t.Errorf("redeem the attacker's result: %d %s, want 409 account_mismatch", code, raw)
	}
	resp, _ = browser(t, s, s.connectSession("acme", `,"return_to":"http://app.example/settings/done?x=1"`), "attacker", "")
	if back := returned(resp); back == nil || back.Path != "/settings/done" || back.Query().Get("x") != "1" ||
		back.Query().Get("connection") != "acme" || back.Query().Get("status") != "pending" {
		t.Errorf("attacker's consent with return_to: %s Location %q", resp.Status, resp.Header.Get("Location"))
	} else if code, _, raw := s.redeem(s.key, back.Query().Get("result")); code != http.StatusConflict {
		t.Errorf("redeem the attacker's second result: %d %s, want 409", code, raw)
	}
	if after := storedRow(t, s.dbURL, "acme"); after != before {
		t.Errorf("the attacker's consent changed the stored grant:\nbefore %s\nafter  %s", before, after)
	}
}

// checkAllowedAccountChange: a session that allows the change moves the
// connection; a narrower consent is stored and reported.
func checkAllowedAccountChange(t *testing.T, s *stack, bin string, rcv *receiver) {
	if r := s.connectVia("acme", `,"allow_account_change":true`, "new-owner", "api"); r.Account != "new-owner" || strings.Join(r.MissingScopes, " ") != "write" {
		t.Errorf("allowed account change: %+v", r)
	}
	if row := storedRow(t, s.dbURL, "acme"); !strings.Contains(row, `"granted_account":"new-owner"`) || !strings.Contains(row, `"missing_scopes":["write"]`) {
		t.Errorf("after the allowed change: %s", row)
	}
	if r := run(t, bin, "tokenctl", s.env, "", "status"); r.code != 0 || !strings.Contains(r.stdout, "acme: granted by new-owner; missing scopes: write") {
		t.Errorf("tokenctl status does not report the narrower grant:\n%s", r.stdout)
	}
	if code, body := s.do(http.MethodGet, "/metrics", ""); code != http.StatusOK ||
		!strings.Contains(body, `tokenguard_connect_grants_total{outcome="scopes_narrowed"} 1`) ||
		!strings.Contains(body, `tokenguard_connect_grants_total{outcome="account_mismatch"} 2`) ||
		!strings.Contains(body, `tokenguard_connect_grants_total{outcome="pending"} 4`) {
		t.Errorf("metrics: %d\n%s", code, grep(body, "tokenguard_connect_grants_total"))
	}
	waitfor.Until(t, 30*time.Second, "the two connected events", func() bool {
		ev, _, _ := rcv.snapshot()
		return len(ev) == 2
	})
}

// checkWebhooksOnce: every event was acknowledged once, in order of
// occurrence, and River holds no other; some needed a retry.
func checkWebhooksOnce(t *testing.T, s *stack, rcv *receiver) {
	events, acked, bad := rcv.snapshot()
	// Retries do not keep the order: receivers order by occurred_at.
	slices.SortFunc(events, func(a, b webhookEvent) int { return a.OccurredAt.Compare(b.OccurredAt) })
	var types []string
	for _, e := range events {
		types = append(types, e.Type)
		if acked[e.ID] != 1 {
			t.Errorf("event %s (%s) acknowledged %d times", e.ID, e.Type, acked[e.ID])
		}
	}
	if want := "connection.connected,connection.connected,connection.needs_reauth,connection.recovered"; strings.Join(types, ",") != want {
		t.Errorf("events %v, want %s", types, want)
	}
	if len(bad) > 0 {
		t.Errorf("receiver rejected deliveries: %v", bad)
	}
	// Every event River holds was delivered, and some only after retries.
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, s.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var ids []string
	var retried int
	if err := conn.QueryRow(ctx, `SELECT array_agg(args->>'id' ORDER BY id), count(*) FILTER (WHERE attempt > 1)
FROM river_job WHERE kind = 'tokenguard_webhook'`).Scan(&ids, &retried); err != nil {
		t.Fatal(err)
	}
	if len(ids) != len(events) {
		t.Errorf("River holds %d webhook events, the receiver got %d", len(ids), len(events))
	}
	for _, id := range ids {
		if acked[id] != 1 {
			t.Errorf("event %s acknowledged %d times", id, acked[id])
		}
	}
	if retried == 0 {
		t.Error("no webhook event needed a retry: the receiver was not down when it mattered")
	}
	t.Logf("webhook events: %v; %d delivered after retries; ids %v", types, retried, ids)
}

func expectJSONError401(t *testing.T, s *stack, key, method, path string) {
	t.Helper()
	code, body := s.doWith(key, method, path, `{"connection":"acme"}`)
	var e struct {
		Error string `json:"error"`
		Code  string `json:"code"`
	}
	if code != http.StatusUnauthorized || json.Unmarshal([]byte(body), &e) != nil || e.Code != "unauthorized" || e.Error == "" {
		t.Errorf("%s %s with key %.6q…: %d %s, want 401 with the JSON error shape", method, path, key, code, body)
	}
}

func grep(text, what string) string {
	var out []string
	for l := range strings.SplitSeq(text, "\n") {
		if strings.Contains(l, what) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
