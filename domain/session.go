package domain

import "time"

// ConnectSession is what a connect session allows: connecting one
// connection, once, through a browser.
type ConnectSession struct {
	Connection         string
	ReturnTo           string // where the browser goes afterwards; "" for tokenguard's own page
	AllowAccountChange bool   // a grant from another account may replace the connection's
	CreatedBy          string // the API key's name
	Provider           string // the connection's provider; "" for the environment's
	// Metadata, when not nil, replaces the connection's metadata and tags
	// when the consent completes.
	Metadata  *Metadata
	ExpiresAt time.Time
	// The browser flow's OAuth2 state and PKCE verifier, kept server-side.
	State, Verifier string
}
