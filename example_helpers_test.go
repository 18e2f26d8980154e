package tokenguard_test

import (
	"context"
	"log"
	"net/http/httptest"
	"sync"
	"testing"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/internal/sandbox"
	"github.com/tokenguard/tokenguard/internal/testdb"
)

// The examples run against a fresh database of their own on the test
// server (TEST_DATABASE_URL, found as for every test) and the strict
// sandbox provider; these helpers stand for what an application already
// has: its database URL, its client registration, a first grant.

var (
	sandboxOnce sync.Once
	sandboxP    *sandbox.Provider
	sandboxURL  string
)

func startSandbox() {
	sandboxOnce.Do(func() {
		p, err := sandbox.New(sandbox.Options{})
		if err != nil {
			log.Fatal(err)
		}
		srv := httptest.NewServer(p.Handler())
		testdb.AtExit(srv.Close)
		sandboxP, sandboxURL = p, srv.URL
	})
}

// databaseURL is a fresh, empty database for one example.
func databaseURL() string { return testdb.NewEmpty(exampleTB{}) }

// oauthConfig is the application's client registration at the provider.
func oauthConfig() *oauth2.Config {
	startSandbox()
	c := sandboxP.OAuth2Config(sandboxURL)
	c.Endpoint.AuthStyle = oauth2.AuthStyleInHeader
	return c
}

// apiURL is the provider's protected API.
func apiURL() string {
	startSandbox()
	return sandboxURL
}

// firstGrant is a token from the authorization-code flow (the
// application's "connect" callback would have it).
func firstGrant() *oauth2.Token {
	tok, err := sandbox.Grant(context.Background(), oauthConfig())
	if err != nil {
		log.Fatal(err)
	}
	return tok
}

// exampleTB lets the examples use testdb, which drops their databases
// when the tests end.
type exampleTB struct{ testing.TB }

func (exampleTB) Helper()                   {}
func (exampleTB) Cleanup(f func())          { testdb.AtExit(f) }
func (exampleTB) Errorf(f string, a ...any) { log.Printf(f, a...) }
func (exampleTB) Fatalf(f string, a ...any) { log.Fatalf(f, a...) }
func (exampleTB) Name() string              { return "Example" }
