package httpapi

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
)

// TestOpenAPIMatchesRoutes: every route of the table is in the served
// document with its method (a route of any method with the usual ones),
// every operation of the document is a route, the routes without an API
// key are exactly the operations without security, and every other
// operation names the scope the route table gives its route.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	s := testServer(local)
	w := httptest.NewRecorder()
	s.Handler().ServeHTTP(w, httptest.NewRequest("GET", "http://127.0.0.1:8080/openapi.json", nil))
	var doc struct {
		OpenAPI string `json:"openapi"`
		Paths   map[string]map[string]struct {
			Security *[]map[string][]string
			Scope    string `json:"x-tokenguard-scope"`
		} `json:"paths"`
	}
	if w.Code != http.StatusOK || json.Unmarshal(w.Body.Bytes(), &doc) != nil || doc.OpenAPI != "3.1.0" {
		t.Fatalf("GET /openapi.json: %d %.200s", w.Code, w.Body)
	}
	anyMethod := []string{"get", "post", "put", "patch", "delete", "head", "options"}
	inTable := map[string]bool{}
	for _, rt := range s.routes() {
		path := strings.ReplaceAll(rt.path, "...}", "}") // OpenAPI has no multi-segment parameter
		methods := []string{strings.ToLower(rt.method)}
		if rt.method == "" {
			methods = anyMethod
		}
		for _, m := range methods {
			inTable[m+" "+path] = true
			op, ok := doc.Paths[path][m]
			if !ok {
				t.Errorf("route %s: no %s %s in openapi.json", rt.pattern(), m, path)
				continue
			}
			public := op.Security != nil && len(*op.Security) == 0
			if _, listed := publicRoutes[rt.pattern()]; public != listed {
				t.Errorf("%s %s: without security in openapi.json %t, public route %t", m, path, public, listed)
			}
			if public {
				continue
			}
			// The scope the route table gives the route, in the security
			// requirement and in x-tokenguard-scope.
			if op.Security == nil || len(*op.Security) != 1 || !slices.Equal((*op.Security)[0]["apiKey"], []string{string(rt.scope)}) || op.Scope != string(rt.scope) {
				t.Errorf("%s %s: security %v, x-tokenguard-scope %q; the route table says scope %q", m, path, op.Security, op.Scope, rt.scope)
			}
		}
	}
	for path, ops := range doc.Paths {
		for m := range ops {
			if !inTable[m+" "+path] && !slices.Contains([]string{"parameters", "summary", "description"}, m) {
				t.Errorf("openapi.json has %s %s, which is no route", m, path)
			}
		}
	}
}
