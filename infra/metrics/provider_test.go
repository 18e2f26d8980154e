package metrics_test

import (
	"fmt"
	"testing"

	"github.com/tokenguard/tokenguard/infra/metrics"
	"github.com/tokenguard/tokenguard/usecase"
)

// The provider label names the connection's provider ("default" for the
// OAUTH_* one) and takes at most MaxProviderLabels values besides.
func TestProviderLabelIsBounded(t *testing.T) {
	m, route := newMetrics(metrics.Options{})
	m.Refreshed(usecase.RefreshEvent{Connection: "a", Outcome: usecase.OutcomeOK, ProviderLatency: 1})
	m.Refreshed(usecase.RefreshEvent{Connection: "b", Provider: "idp-b", Outcome: usecase.OutcomeClientRejected, ProviderLatency: 1})
	fams, _ := scrape(t, route)
	if got := value(fams, "tokenguard_token_refreshes_total", "outcome", "ok", "provider", metrics.DefaultProvider); got != 1 {
		t.Errorf("ok{provider=default} = %v, want 1", got)
	}
	if got := value(fams, "tokenguard_token_refreshes_total", "outcome", "client_rejected", "provider", "idp-b"); got != 1 {
		t.Errorf("client_rejected{provider=idp-b} = %v, want 1", got)
	}
	if got := value(fams, "tokenguard_provider_refresh_duration_seconds", "provider", "idp-b"); got != 1 {
		t.Errorf("latency{provider=idp-b} count = %v, want 1", got)
	}

	for i := range 2 * metrics.MaxProviderLabels {
		m.Refreshed(usecase.RefreshEvent{Connection: "c", Provider: fmt.Sprintf("p%d", i), Outcome: usecase.OutcomeOK})
	}
	fams, _ = scrape(t, route)
	values := map[string]bool{}
	for _, s := range fams["tokenguard_token_refreshes_total"].GetMetric() {
		for _, l := range s.GetLabel() {
			if l.GetName() == "provider" {
				values[l.GetValue()] = true
			}
		}
	}
	// default, plus MaxProviderLabels names (idp-b among them), plus other.
	if len(values) != metrics.MaxProviderLabels+2 || !values[metrics.OtherProviders] {
		t.Errorf("%d provider label values, want %d with %q", len(values), metrics.MaxProviderLabels+2, metrics.OtherProviders)
	}
	if got := value(fams, "tokenguard_token_refreshes_total", "provider", metrics.OtherProviders); got != float64(metrics.MaxProviderLabels+1) {
		t.Errorf("refreshes{provider=other} = %v, want %d", got, metrics.MaxProviderLabels+1)
	}
}
