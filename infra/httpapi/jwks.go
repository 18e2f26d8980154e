package httpapi

import "net/http"

// ClientKeys serve the public halves of the client keys in use
// (private_key_jwt); *tokenguard.Tokens is one.
type ClientKeys interface {
	ClientJWKS() []byte
}

// jwks answers GET /.well-known/jwks.json, the client keys' public halves
// for providers that fetch them (AT Protocol). Public by design.
func (s *Server) jwks(w http.ResponseWriter, _ *http.Request) {
	body := []byte(`{"keys":[]}`)
	if k, ok := s.deps.Tokens.(ClientKeys); ok {
		body = k.ClientJWKS()
	}
	w.Header().Set("Content-Type", "application/jwk-set+json")
	w.Header().Set("Cache-Control", "max-age=300")
	_, _ = w.Write(body)
}
