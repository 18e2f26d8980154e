package usecase_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/usecase"
)

type caLister struct {
	toks []domain.Token
	err  error
}

func (l caLister) Each(_ context.Context, fn func(domain.Token) error) error {
	if l.err != nil {
		return l.err
	}
	for _, t := range l.toks {
		if err := fn(t); err != nil {
			return err
		}
	}
	return nil
}

func (l caLister) Get(_ context.Context, id string) (domain.Token, error) {
	for _, t := range l.toks {
		if t.Connection == id {
			return t, nil
		}
	}
	return domain.Token{}, domain.ErrNotFound
}

type caCaller struct {
	mu    sync.Mutex
	calls []string
	fail  map[string]error
}

func (c *caCaller) Call(_ context.Context, id, path string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls = append(c.calls, id+path)
	return c.fail[id]
}

func caToken(id string, s domain.Status) domain.Token {
	return domain.Token{Connection: id, Status: s, AccessToken: domain.NewSecret("at")}
}

func TestCallAllCallsEveryActiveConnectionOnce(t *testing.T) {
	boom := errors.New("503")
	l := caLister{toks: []domain.Token{caToken("a", domain.StatusActive), caToken("b", domain.StatusNeedsReauth),
		caToken("c", domain.StatusActive), caToken("d", domain.StatusActive)}}
	api := &caCaller{fail: map[string]error{"c": boom}}
	res, err := usecase.NewCallAllUseCase(l, api, "/resource", 2).CallAll(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(api.calls) != 3 {
		t.Errorf("calls = %v, want a, c and d once each", api.calls)
	}
	if len(res.Calls) != 3 || res.Calls[0].Connection != "a" || res.Calls[1].Connection != "c" ||
		!errors.Is(res.Calls[1].Err, boom) || res.Calls[2].Err != nil {
		t.Errorf("result = %+v", res)
	}
	if len(res.Skipped) != 1 || res.Skipped[0] != "b" {
		t.Errorf("skipped = %v, want [b]", res.Skipped)
	}
	if _, err := usecase.NewCallAllUseCase(caLister{err: domain.ErrStoreUnavailable}, api, "/r", 1).CallAll(context.Background()); !errors.Is(err, domain.ErrStoreUnavailable) {
		t.Errorf("list failure: err = %v", err)
	}
}

type caQueue struct{ got []string }

func (q *caQueue) Enqueue(_ context.Context, id string, p json.RawMessage) (int64, error) {
	q.got = append(q.got, id+string(p))
	return int64(len(q.got)), nil
}

func TestEnqueueRefusesWhatTheWorkerCouldNotHandle(t *testing.T) {
	l := caLister{toks: []domain.Token{caToken("ok", domain.StatusActive), caToken("dead", domain.StatusNeedsReauth)}}
	q := &caQueue{}
	uc := usecase.NewEnqueueEventUseCase(l, q)
	if id, err := uc.Enqueue(context.Background(), "ok", json.RawMessage(`{"n":1}`)); err != nil || id != 1 {
		t.Errorf("Enqueue(ok) = %d, %v", id, err)
	}
	for id, want := range map[string]error{"dead": domain.ErrNeedsReauth, "nobody": domain.ErrNotFound, "a/b": domain.ErrInvalidConnection} {
		if _, err := uc.Enqueue(context.Background(), id, nil); !errors.Is(err, want) {
			t.Errorf("Enqueue(%s) err = %v, want %v", id, err, want)
		}
	}
	if len(q.got) != 1 || q.got[0] != `ok{"n":1}` {
		t.Errorf("queued %q", q.got)
	}
}
