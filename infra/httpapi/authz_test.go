package httpapi

import (
	"cmp"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/tokenguard/tokenguard"
	"github.com/tokenguard/tokenguard/domain"
)

// pendingFlows holds one pending connect result, tgr_acme for acme, and
// spends it only when allow accepts its connection.
type pendingFlows struct {
	noFlows
	spent bool
}

func (f *pendingFlows) RedeemFor(_ context.Context, code string, allow func(string) error) (tokenguard.Connected, error) {
	if code != "tgr_acme" || f.spent {
		return tokenguard.Connected{}, domain.ErrResultInvalid
	}
	if allow != nil {
		if err := allow("acme"); err != nil {
			return tokenguard.Connected{Connection: "acme"}, err
		}
	}
	f.spent = true
	return tokenguard.Connected{Connection: "acme", Account: "u-1"}, nil
}

// twoTenants lists acme and tenant-b-2.
type twoTenants struct{}

// It ignores the filter: the handler's own check keeps what the key sees.
func (twoTenants) FilteredConnectionsPage(_ context.Context, _ domain.ConnectionFilter, after string, limit int) ([]domain.Connection, error) {
	var out []domain.Connection
	for _, n := range []string{"acme", "tenant-b-2"} {
		if n > after && len(out) < limit {
			out = append(out, domain.Connection{Name: n})
		}
	}
	return out, nil
}

// authzRows says, for every route that takes a key, how a request names
// its connection (acme): in the path, in the body, through a connect
// result, or not at all (a listing, which shows only what the patterns
// match). A route added to the table without a row fails
// TestAuthorizationTable.
var authzRows = map[string]struct {
	body    string
	names   bool // the request names acme
	listing bool // the answer lists connections
}{
	"GET /connections/{name}/token":          {names: true},
	"POST /connections/{name}/token/refresh": {names: true},
	"/connections/{name}/proxy/{path...}":    {names: true},
	"GET /connections/{name}/resource":       {names: true},
	"POST /connections/{name}/events":        {body: `{}`, names: true},
	"POST /connections/{name}/dpop-proof":    {body: `{"method":"GET","url":"https://api.example/v1"}`, names: true},
	"POST /connect-sessions":                 {body: `{"connection":"acme","return_to":"http://app.example/done"}`, names: true},
	"POST /connect-results":                  {body: `{"result":"tgr_acme"}`, names: true},
	"GET /connections":                       {listing: true},
	"GET /metrics":                           {},
}

// TestAuthorizationTable walks every route of the table, on its real
// handler, with a key of each shape: the scope missing (403
// missing_scope), every scope but patterns that miss acme (403
// connection_not_allowed wherever acme is named, listings without it),
// and a key allowed both (no 403). One rule decides all:
// domain.KeyAccess.Permit.
func TestAuthorizationTable(t *testing.T) {
	flows := &pendingFlows{}
	s := testServer(local)
	s.deps.Keys = oneKey{"tgk_good", map[string]domain.KeyAccess{
		"tgk_noscope": {ID: 5, Name: "noscope", Scopes: []domain.Scope{}},
		"tgk_tenantb": {ID: 6, Name: "tenant-b", Connections: []string{"tenant-b-*"}},
		"tgk_acme":    {ID: 7, Name: "acme", Connections: []string{"ac*"}},
	}}
	s.deps.Flows, s.deps.Connections = flows, twoTenants{}
	// Routes of one connection behind their real guard with a handler
	// that answers 200 (the guard decides; their stores are absent here);
	// the others, whose connection is in the body or a listing, on their
	// real handlers.
	h := http.NewServeMux()
	for _, rt := range s.routes() {
		if strings.Contains(rt.path, "{name}") {
			rt.handle = func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }
		}
		h.Handle(rt.pattern(), s.guard(rt))
	}
	do := func(key, method, path, body string) (*httptest.ResponseRecorder, errorBody) {
		req := httptest.NewRequest(method, "http://127.0.0.1:8080"+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		var f errorBody
		if w.Code == http.StatusForbidden {
			_ = json.Unmarshal(w.Body.Bytes(), &f)
		}
		return w, f
	}
	for _, rt := range s.routes() {
		if _, public := publicRoutes[rt.pattern()]; public {
			continue
		}
		row, ok := authzRows[rt.pattern()]
		if !ok {
			t.Errorf("%s has no row in authzRows: say how it names a connection", rt.pattern())
			continue
		}
		method := cmp.Or(rt.method, "GET")
		path := sample(rt.path)
		if w, f := do("tgk_noscope", method, path, row.body); w.Code != http.StatusForbidden || f.Code != "missing_scope" {
			t.Errorf("%s, key without the scope: %d %+v, want 403 missing_scope", rt.pattern(), w.Code, f)
		}
		w, f := do("tgk_tenantb", method, path, row.body)
		switch {
		case row.names && (w.Code != http.StatusForbidden || f.Code != "connection_not_allowed" || f.Connection != "acme"):
			t.Errorf("%s for acme, tenant-b-* key: %d %+v, want 403 connection_not_allowed", rt.pattern(), w.Code, f)
		case !row.names && w.Code == http.StatusForbidden:
			t.Errorf("%s, tenant-b-* key: 403 %+v", rt.pattern(), f)
		case row.listing && strings.Contains(w.Body.String(), `"acme"`):
			t.Errorf("%s, tenant-b-* key lists acme: %s", rt.pattern(), w.Body)
		}
		w, f = do("tgk_acme", method, path, row.body)
		if w.Code == http.StatusForbidden {
			t.Errorf("%s, key allowed acme: 403 %+v", rt.pattern(), f)
		}
		if row.listing && !strings.Contains(w.Body.String(), `"acme"`) {
			t.Errorf("%s, key allowed acme does not list it: %s", rt.pattern(), w.Body)
		}
	}
	for p := range authzRows {
		if !slices.ContainsFunc(s.routes(), func(rt route) bool { return rt.pattern() == p }) {
			t.Errorf("authzRows names %s, which is not a route", p)
		}
	}
	if !flows.spent {
		t.Error("the connect result was not redeemed by the key allowed its connection")
	}
}

// TestRedeemRefusedLeavesResult reproduces finding 1: a key limited to
// tenant-b-* redeeming acme's result gets 403 connection_not_allowed and
// the result stays for a key that may (the control, a key of every
// right, redeems it).
func TestRedeemRefusedLeavesResult(t *testing.T) {
	flows := &pendingFlows{}
	s := testServer(local)
	s.deps.Keys = oneKey{"tgk_good", map[string]domain.KeyAccess{"tgk_tenantb": {ID: 6, Name: "tenant-b", Connections: []string{"tenant-b-*"}}}}
	s.deps.Flows = flows
	h := s.Handler()
	post := func(key string) int {
		req := httptest.NewRequest("POST", "http://127.0.0.1:8080/connect-results", strings.NewReader(`{"result":"tgr_acme"}`))
		req.Header.Set("Authorization", "Bearer "+key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w.Code
	}
	if code := post("tgk_tenantb"); code != http.StatusForbidden || flows.spent {
		t.Fatalf("tenant-b-* key redeeming acme's result: %d, spent %t; want 403, unspent", code, flows.spent)
	}
	if code := post("tgk_good"); code != http.StatusOK || !flows.spent {
		t.Fatalf("key of every right: %d, spent %t; want 200, spent", code, flows.spent)
	}
}
