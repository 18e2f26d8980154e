package provider_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/clientkey"
	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/infra/provider/profiles"
)

// When the connect flow pushes its authorization request, by mode, the
// profile and the metadata.
func TestPAREndpoint(t *testing.T) {
	const ep = "https://as.example/par"
	advertised := provider.Metadata{PAREndpoint: ep}
	required := provider.Metadata{PAREndpoint: ep, RequirePAR: true}
	for name, c := range map[string]struct {
		mode    domain.PARMode
		profile bool
		m       provider.Metadata
		found   bool
		want    string
		err     error
	}{
		"never, even when required":     {domain.PARNever, true, required, true, "", nil},
		"auto, advertised only":         {domain.PARAuto, false, advertised, true, "", nil},
		"auto, metadata requires":       {domain.PARAuto, false, required, true, ep, nil},
		"auto, profile requires":        {domain.PARAuto, true, advertised, true, ep, nil},
		"auto, profile, no metadata":    {domain.PARAuto, true, provider.Metadata{}, false, "", domain.ErrNoPAREndpoint},
		"auto, no metadata":             {domain.PARAuto, false, provider.Metadata{}, false, "", nil},
		"always, advertised":            {domain.PARAlways, false, advertised, true, ep, nil},
		"always, metadata without PAR":  {domain.PARAlways, false, provider.Metadata{Issuer: "x"}, true, "", domain.ErrNoPAREndpoint},
		"always, no metadata":           {domain.PARAlways, false, provider.Metadata{}, false, "", domain.ErrNoPAREndpoint},
		"unset mode is auto (required)": {"", false, required, true, ep, nil},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := provider.PAREndpoint(c.mode, c.profile, c.m, c.found)
			if got != c.want || !errors.Is(err, c.err) || (c.err == nil && err != nil) {
				t.Fatalf("= %q, %v; want %q, %v", got, err, c.want, c.err)
			}
		})
	}
}

func TestParsePARMode(t *testing.T) {
	for in, want := range map[string]domain.PARMode{"": domain.PARAuto, "auto": domain.PARAuto, "always": domain.PARAlways, "never": domain.PARNever} {
		if got, err := domain.ParsePARMode(in); err != nil || got != want {
			t.Errorf("ParsePARMode(%q) = %q, %v", in, got, err)
		}
	}
	for _, in := range []string{"Auto", "yes", "required", " auto"} {
		if _, err := domain.ParsePARMode(in); !errors.Is(err, domain.ErrInvalidProvider) {
			t.Errorf("ParsePARMode(%q) = %v, want ErrInvalidProvider", in, err)
		}
	}
}

// asServer is an authorization server with metadata under issuerPath (RFC
// 8414 form) whose token endpoint and PAR endpoint record the client
// assertions' aud.
func asServer(t *testing.T, issuerPath string) (*httptest.Server, *[]string) {
	var mu sync.Mutex
	var auds []string
	srv := httptest.NewServer(nil)
	t.Cleanup(srv.Close)
	iss := srv.URL + issuerPath
	record := func(r *http.Request) {
		_ = r.ParseForm()
		parts := strings.Split(r.PostForm.Get("client_assertion"), ".")
		var claims struct{ Aud string }
		if len(parts) == 3 {
			b, _ := base64.RawURLEncoding.DecodeString(parts[1])
			_ = json.Unmarshal(b, &claims)
		}
		mu.Lock()
		auds = append(auds, claims.Aud)
		mu.Unlock()
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/.well-known/oauth-authorization-server"+issuerPath, func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(provider.Metadata{Issuer: iss, TokenEndpoint: iss + "/v1/token", PAREndpoint: iss + "/v1/par", RequirePAR: true})
	})
	mux.HandleFunc(issuerPath+"/v1/token", func(w http.ResponseWriter, r *http.Request) {
		record(r)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"access_token":"a","token_type":"Bearer","expires_in":60,"refresh_token":"r2"}`))
	})
	mux.HandleFunc(issuerPath+"/v1/par", func(w http.ResponseWriter, r *http.Request) {
		record(r)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"request_uri":"urn:ietf:params:oauth:request_uri:x","expires_in":60}`))
	})
	srv.Config.Handler = mux
	return srv, &auds
}

// The assertions' aud is the token endpoint by default and the issuer the
// metadata names when the profile says so, at the token endpoint and the
// PAR endpoint alike; the metadata is found under the issuer's path.
func TestAssertionAudience(t *testing.T) {
	srv, auds := asServer(t, "/oauth2/default")
	iss := srv.URL + "/oauth2/default"
	priv, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	k, _ := clientkey.FromSigner(priv)
	d := provider.NewDiscovery(srv.Client())
	m, ok := d.Find(context.Background(), iss+"/v1/token")
	if !ok || m.Issuer != iss || m.PAREndpoint != iss+"/v1/par" || !m.RequirePAR {
		t.Fatalf("discovery: %+v %v", m, ok)
	}
	if _, ok := d.Find(context.Background(), srv.URL+"/other/v1/token"); ok {
		t.Fatal("metadata taken for a token endpoint it does not name")
	}
	cfg := &oauth2.Config{ClientID: "c", Endpoint: oauth2.Endpoint{TokenURL: iss + "/v1/token", AuthStyle: oauth2.AuthStyleInParams}}
	for name, c := range map[string]struct {
		opts []provider.Option
		want string
	}{
		"token endpoint": {provider.ClientOptions("", k, profiles.Profile{}, d), iss + "/v1/token"},
		"issuer":         {provider.ClientOptions("", k, profiles.Profile{AssertionAud: domain.AudienceIssuer}, d), iss},
	} {
		t.Run(name, func(t *testing.T) {
			*auds = nil
			r := provider.NewRefresher(cfg, srv.Client(), c.opts...)
			if _, err := r.Refresh(context.Background(), domain.NewSecret("r1")); err != nil {
				t.Fatal(err)
			}
			if uri, err := r.Push(context.Background(), m.PAREndpoint, map[string][]string{"response_type": {"code"}}); err != nil || uri == "" {
				t.Fatalf("push: %q %v", uri, err)
			}
			if len(*auds) != 2 || (*auds)[0] != c.want || (*auds)[1] != c.want {
				t.Fatalf("aud %v, want %s twice", *auds, c.want)
			}
		})
	}
}
