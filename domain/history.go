package domain

import "time"

// ConnectionEvent is one line of a connection's recent history: a refresh
// and how it ended, or a change a webhook announces (connected,
// needs_reauth, recovered, disconnected, rolled_back).
type ConnectionEvent struct {
	ID         int64
	Connection string
	Kind       string // "refresh", or the webhook event's type without "connection."
	// Outcome of a refresh: "ok" (a rotated token stored), "needs_reauth"
	// (the grant was dead), "not_stored" (the call failed; the stored token
	// was kept).
	Outcome  string
	Reason   string
	Provider string
	Version  int64         // stored afterwards; 0 when not known
	Duration time.Duration // of a refresh, from its lease to its end
	At       time.Time
}

// ConnectionFilter narrows a listing of connections. Zero fields match
// everything.
type ConnectionFilter struct {
	// Status is a stored status (active, needs_reauth, or any other the
	// store holds), or StatusExpiringSoon.
	Status Status
	// Provider is a stored provider's name, or EnvProvider for the
	// connections of the OAUTH_* provider.
	Provider   string
	Tag        string
	NamePrefix string
	// Patterns are the connection patterns of the key the listing is for
	// (KeyAccess.Connections): nil, every connection; empty, none.
	Patterns []string
}

// StatusExpiringSoon filters connections that are active and whose refresh
// token expires within ExpiringSoonWithin.
const StatusExpiringSoon Status = "expiring_soon"

// ExpiringSoonWithin is what "expiring soon" means.
const ExpiringSoonWithin = 7 * 24 * time.Hour

// EnvProvider names, in a filter, the provider of the environment (whose
// connections store no provider name); no stored provider can be called
// so (a name starts with a letter or digit).
const EnvProvider = "_env"

// RefreshRate is a provider's refreshes over a window.
type RefreshRate struct {
	Provider string
	OK       int
	Total    int
}
