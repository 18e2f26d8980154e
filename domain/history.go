package domain

import "time"

// ConnectionEvent is one line of a connection's history: a refresh, or a change a webhook announces.
type ConnectionEvent struct {
	ID         int64
	Connection string
	Kind       string // "refresh", or the webhook event's type without "connection."
	Outcome    string // of a refresh: "ok", "needs_reauth" or "not_stored" (the stored token was kept)
	Reason     string
	Provider   string
	Version    int64         // stored afterwards; 0 when not known
	Duration   time.Duration // of a refresh, from its lease to its end
	At         time.Time
}

// ConnectionFilter narrows a listing of connections; zero fields match all.
type ConnectionFilter struct {
	Status     Status // a stored status, or StatusExpiringSoon
	Provider   string // a stored provider's name, or EnvProvider
	Tag        string
	NamePrefix string
	Patterns   []string // the listing key's KeyAccess.Connections: nil, all; empty, none
}

// StatusExpiringSoon filters active connections whose refresh token expires within ExpiringSoonWithin.
const StatusExpiringSoon Status = "expiring_soon"

// ExpiringSoonWithin is what "expiring soon" means.
const ExpiringSoonWithin = 7 * 24 * time.Hour

// EnvProvider names the OAUTH_* provider in a filter; no stored provider's name starts with '_'.
const EnvProvider = "_env"

// RefreshRate is a provider's refreshes over a window.
type RefreshRate struct {
	Provider string
	OK       int
	Total    int
}
