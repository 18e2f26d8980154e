package metrics

import (
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// connectOutcomes are the values of tokenguard_connect_grants_total's
// outcome label; every other code of the connect flow counts as "failed".
var connectOutcomes = []string{"pending", "connected", "scopes_narrowed", "account_mismatch", "bad_state", "exchange_failed", "failed"}

// ConnectCounter counts the ends of the server's browser connect flow.
type ConnectCounter struct{ c *prometheus.CounterVec }

// NewConnectCounter registers the counter on reg.
func NewConnectCounter(reg prometheus.Registerer) *ConnectCounter {
	c := promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
		Name: "tokenguard_connect_grants_total",
		Help: "Steps of the connect flow by outcome: pending (a consent's grant waits for its redemption), connected (redeemed), scopes_narrowed (connected with fewer scopes than OAUTH_SCOPES), account_mismatch (refused: another provider account), bad_state, exchange_failed, failed (anything else, the provider's refusal included).",
	}, []string{"outcome"})
	for _, o := range connectOutcomes {
		c.WithLabelValues(o)
	}
	return &ConnectCounter{c}
}

// ConnectOutcome counts one end of the connect flow.
func (m *ConnectCounter) ConnectOutcome(code string) {
	if !slices.Contains(connectOutcomes, code) {
		code = "failed"
	}
	m.c.WithLabelValues(code).Inc()
}
