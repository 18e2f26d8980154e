package domain

import "time"

// ConnectSession is what a connect session allows: connecting one connection, once, through a browser.
type ConnectSession struct {
	Connection         string
	ReturnTo           string    // where the browser goes afterwards; "" for tokenguard's own page
	AllowAccountChange bool      // a grant from another account may replace the connection's
	CreatedBy          string    // the API key's name
	Provider           string    // the connection's provider; "" for the environment's
	Metadata           *Metadata // not nil: replaces the connection's when the consent completes
	ExpiresAt          time.Time
	State, Verifier    string // the browser flow's OAuth2 state and PKCE verifier, kept server-side
}

// PendingGrant is a grant the connect flow keeps unstored until the application's backend
// redeems its result code: the tokens, who granted them, and what the session asked for.
type PendingGrant struct {
	Connection         string
	Provider           string // "" for the environment's
	CreatedBy          string // the API key that asked for the session
	AllowAccountChange bool
	Metadata           *Metadata // nil: the connection keeps its own
	ProviderFields     map[string]string
	Binding            Binding
	Grant              Grant
	ExpiresAt          time.Time
	DPoPKey            Secret // PEM of the DPoP key the grant is bound to; zero for a bearer grant
	DPoPJKT            string
}

// ExpiredGrant is a pending grant nobody redeemed in time: its refresh token is revoked at Provider, then row ID deleted.
type ExpiredGrant struct {
	ID           int64
	Connection   string
	Provider     string
	RefreshToken Secret
	CreatedAt    time.Time
	DPoPKey      Secret // PEM of a DPoP-bound grant's key, which its revocation proves
}
