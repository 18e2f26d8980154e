package queue

import (
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/tokenguard/tokenguard/domain"
)

// The signature is HMAC-SHA256 over "<t>.<body>"; the expected value is
// from openssl:
//
//	printf '1700000000.{"id":"evt_1"}' | openssl dgst -sha256 -hmac whsec_test
func TestSign(t *testing.T) {
	got := Sign(domain.NewSecret("whsec_test"), time.Unix(1700000000, 0), []byte(`{"id":"evt_1"}`))
	want := "t=1700000000,v1=" + opensslHMAC
	if got != want {
		t.Errorf("Sign = %s, want %s", got, want)
	}
}

func TestWebhookBackoff(t *testing.T) {
	w := &webhookWorker{}
	for attempt, want := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 5: 16 * time.Second, 12: 2048 * time.Second, 13: time.Hour, 25: time.Hour} {
		got := time.Until(w.NextRetry(&river.Job[WebhookEvent]{JobRow: jobRow(attempt)}))
		if got < want-50*time.Millisecond || got > want+want/10+50*time.Millisecond {
			t.Errorf("attempt %d: retry in %v, want %v plus up to 10%%", attempt, got, want)
		}
	}
}

const opensslHMAC = "c89214b5b5da833daed6f0b8c5bb6bd58cea9022bd80ccc78230f3942d632925"

func jobRow(attempt int) *rivertype.JobRow { return &rivertype.JobRow{Attempt: attempt} }
