package httpapi

import (
	_ "embed"
	"net/http"
)

// openapiJSON describes every route of routes(); TestOpenAPIMatchesRoutes
// keeps the two in step.
//
//go:embed openapi.json
var openapiJSON []byte

func (s *Server) openapi(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(openapiJSON)
}
