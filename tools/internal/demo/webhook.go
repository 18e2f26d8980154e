package demo

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// hookReceiver is the demo's webhook endpoint: it checks each signature as
// docs/operations.md shows and keeps the events it accepted.
type hookReceiver struct {
	URL    string
	Secret string
	srv    *http.Server

	mu     sync.Mutex
	events []string // "type connection", in order of arrival, once per id
	seen   map[string]bool
	bad    int
}

func startHookReceiver() (*hookReceiver, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	h := &hookReceiver{URL: "http://" + ln.Addr().String() + "/hooks", Secret: "whsec_" + rand.Text(), seen: map[string]bool{}}
	h.srv = &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = h.srv.Serve(ln) }()
	return h, nil
}

func (h *hookReceiver) Close() { _ = h.srv.Close() }

func (h *hookReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	h.mu.Lock()
	defer h.mu.Unlock()
	if !validSignature(h.Secret, r.Header.Get("Tokenguard-Signature"), body) {
		h.bad++
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	var e struct{ ID, Type, Connection string }
	if json.Unmarshal(body, &e) != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	if !h.seen[e.ID] { // deliveries are at least once: deduplicate on the id
		h.seen[e.ID] = true
		h.events = append(h.events, e.Type+" "+e.Connection)
	}
	w.WriteHeader(http.StatusNoContent)
}

// waitFor waits until an event "typ connection" arrived.
func (h *hookReceiver) waitFor(event string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		h.mu.Lock()
		for _, e := range h.events {
			if e == event {
				h.mu.Unlock()
				return nil
			}
		}
		h.mu.Unlock()
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("no webhook %q within %v", event, within)
}

// validSignature: Tokenguard-Signature is t=<unix seconds>,v1=<hex
// HMAC-SHA256 of "<t>.<body>">, at most five minutes old.
func validSignature(secret, header string, body []byte) bool {
	var ts, sig string
	for _, kv := range strings.Split(header, ",") {
		k, v, _ := strings.Cut(kv, "=")
		if k == "t" {
			ts = v
		} else if k == "v1" {
			sig = v
		}
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || time.Since(time.Unix(sec, 0)).Abs() > 5*time.Minute {
		return false
	}
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(ts + "."))
	mac.Write(body)
	return hmac.Equal([]byte(sig), []byte(hex.EncodeToString(mac.Sum(nil))))
}
