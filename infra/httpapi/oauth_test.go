package httpapi

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/usecase"
)

// flowSessions hands out one finished flow.
type flowSessions struct {
	noSessions
	sess domain.ConnectSession
}

func (f flowSessions) Finish(context.Context, domain.Secret) (domain.ConnectSession, error) {
	return f.sess, nil
}

// slowConnector cancels the browser's request (the tab is closed) before it
// stores, and records whether its own context survived that.
type slowConnector struct {
	closeTab func()
	ctxErr   chan error
	binding  chan domain.Binding
}

func (c slowConnector) ConnectGrant(ctx context.Context, id string, _ domain.Grant, r usecase.ConnectRequest) (domain.Token, error) {
	c.closeTab()
	time.Sleep(20 * time.Millisecond)
	c.ctxErr <- ctx.Err()
	c.binding <- r.Binding
	return domain.Token{Connection: id, Status: domain.StatusActive, Version: 1}, ctx.Err()
}

func TestCallbackStoresTheGrantAfterTheBrowserLeft(t *testing.T) {
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"access_token": "at", "refresh_token": "rt", "token_type": "Bearer",
			"expires_in": 3600, "scope": "api"})
	}))
	defer provider.Close()
	reqCtx, closeTab := context.WithCancel(context.Background())
	conn := slowConnector{closeTab: closeTab, ctxErr: make(chan error, 1), binding: make(chan domain.Binding, 1)}
	s := New(Deps{
		Keys:      oneKey{key: "tgk_good"},
		Sessions:  flowSessions{sess: domain.ConnectSession{Connection: "acme", State: "st", Verifier: "ver"}},
		Connector: conn,
		DB:        okPinger{},
		OAuth: &oauth2.Config{ClientID: "c", RedirectURL: "http://127.0.0.1:8080/oauth/callback", Scopes: []string{"api", "write"},
			Endpoint: oauth2.Endpoint{AuthURL: provider.URL + "/auth", TokenURL: provider.URL + "/token"}},
		Edges: local,
	})
	req := httptest.NewRequest("GET", "http://127.0.0.1:8080/oauth/callback?state=st&code=c", nil).WithContext(reqCtx)
	req.AddCookie(&http.Cookie{Name: flowCookie, Value: "tgf_" + strings.Repeat("x", 40)})
	w := httptest.NewRecorder()
	s.Handler().ServeHTTP(w, req)
	if err := <-conn.ctxErr; err != nil {
		t.Errorf("the store's context ended with the browser's request: %v", err)
	}
	if b := <-conn.binding; b.Scopes != "api" || b.MissingScopes != "write" {
		t.Errorf("binding %+v, want granted api, missing write", b)
	}
	if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), `"code":"scopes_narrowed"`) {
		t.Errorf("callback answered %d %s", w.Code, w.Body)
	}
	// The cookie is cleared whatever happened.
	if c := w.Result().Cookies(); len(c) != 1 || c[0].MaxAge >= 0 || !c[0].HttpOnly || c[0].SameSite != http.SameSiteLaxMode {
		t.Errorf("cookies %+v", c)
	}
}
