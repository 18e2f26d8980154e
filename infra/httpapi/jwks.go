package httpapi

import "net/http"

// ClientKeys serve the public halves of the client keys in use
// (private_key_jwt); *tokenguard.Tokens is one.
type ClientKeys interface {
	ClientJWKS() []byte
}

// jwks answers GET /.well-known/jwks.json: the public JSON Web Key Set of
// the client keys in use, for providers that fetch the client's keys (the
// AT Protocol's client metadata names this URL). Public by design.
func (s *Server) jwks(w http.ResponseWriter, _ *http.Request) {
	body := []byte(`{"keys":[]}`)
	if k, ok := s.deps.Tokens.(ClientKeys); ok {
		body = k.ClientJWKS()
	}
	w.Header().Set("Content-Type", "application/jwk-set+json")
	w.Header().Set("Cache-Control", "max-age=300")
	_, _ = w.Write(body)
}
