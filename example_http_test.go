package tokenguard_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"

	"gorm.io/driver/postgres"
	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard"
)

// A net/http handler that calls the provider's API for the connection named
// in the path. Token errors are typed: an unknown connection is a 404, one
// whose grant was revoked must be connected again (409), the rest is
// temporary (503).
func ExampleTokens_Client() {
	ctx := context.Background()
	db, err := gorm.Open(postgres.Open(databaseURL()), &gorm.Config{})
	if err != nil {
		log.Fatal(err)
	}
	if err := tokenguard.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	tokens, err := tokenguard.New(db, oauthConfig())
	if err != nil {
		log.Fatal(err)
	}
	defer tokens.Close(ctx)
	if err := tokens.Import(ctx, "acme", firstGrant()); err != nil {
		log.Fatal(err)
	}

	mux := http.NewServeMux()
	mux.HandleFunc("GET /connections/{name}/resource", func(w http.ResponseWriter, r *http.Request) {
		resp, err := tokens.Client(r.Context(), r.PathValue("name")).Get(apiURL() + "/resource")
		switch {
		case errors.Is(err, tokenguard.ErrNotFound):
			http.Error(w, "unknown connection", http.StatusNotFound)
			return
		case errors.Is(err, tokenguard.ErrNeedsReauth):
			http.Error(w, "connect it again", http.StatusConflict)
			return
		case err != nil:
			http.Error(w, "try again later", http.StatusServiceUnavailable)
			return
		}
		defer resp.Body.Close()
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
	})

	for _, name := range []string{"acme", "globex"} {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/connections/"+name+"/resource", nil))
		fmt.Println(name, rec.Code)
	}
	// Output:
	// acme 200
	// globex 404
}
