package di_test

import (
	"context"
	"log/slog"
	"runtime"
	"strings"
	"testing"

	"github.com/tokenguard/tokenguard/di"
	"github.com/tokenguard/tokenguard/internal/testdb"
)

// Server.Run returns only once its background rounds (the connect results'
// sweep, the history's pruning) have ended: its caller closes the pool next.
func TestServerRunEndsItsRoundsBeforeReturning(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	url := testdb.New(t)
	cfg, err := di.AppConfigFromEnv([]string{"DATABASE_URL=" + url, "OAUTH_TOKEN_URL=http://127.0.0.1:1/token",
		"OAUTH_CLIENT_ID=c", "API_BASE_URL=http://127.0.0.1:1", "HTTP_ADDR=127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	srv, cleanup, err := di.NewServer(context.Background(), cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	for !running("EventPruner).Run") { // its first round starts at once
		runtime.Gosched()
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for _, round := range []string{"EventPruner).Run", "sweepLoop"} {
		if running(round) {
			t.Errorf("%s still runs after Server.Run returned", round)
		}
	}
}

// running says whether a goroutine is in fn.
func running(fn string) bool {
	buf := make([]byte, 1<<20)
	return strings.Contains(string(buf[:runtime.Stack(buf, true)]), fn)
}
