package metrics

import "github.com/prometheus/client_golang/prometheus"

// connectOutcomes are the values of tokenguard_connect_grants_total's
// outcome label; every other code of the connect flow counts as "failed".
var connectOutcomes = []string{"connected", "scopes_narrowed", "account_mismatch", "bad_state", "exchange_failed", "failed"}

func newConnectCounter() *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tokenguard_connect_grants_total",
		Help: "Ends of the browser connect flow by outcome: connected, scopes_narrowed (connected with fewer scopes than OAUTH_SCOPES), account_mismatch (refused: another provider account), bad_state, exchange_failed, failed (anything else, the provider's refusal included).",
	}, []string{"outcome"})
	for _, o := range connectOutcomes {
		c.WithLabelValues(o)
	}
	return c
}

// ConnectOutcome counts one end of the connect flow (httpapi's outcome
// code).
func (m *Metrics) ConnectOutcome(code string) {
	for _, o := range connectOutcomes {
		if o == code {
			m.connects.WithLabelValues(o).Inc()
			return
		}
	}
	m.connects.WithLabelValues("failed").Inc()
}
