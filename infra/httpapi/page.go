package httpapi

import (
	"html/template"
	"net/http"
	"strings"
)

// outcome is how a browser flow ended: shown as a small page, or sent to
// the session's return_to as ?connection=…&status=…&reason=….
type outcome struct {
	httpStatus int
	connected  bool
	Connection string
	Code       string // connected, scopes_narrowed, or what went wrong
	Message    string // for people; never a token
}

func (o outcome) status() string {
	if o.connected {
		return "connected"
	}
	return "error"
}

var pageTmpl = template.Must(template.New("page").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">
<title>{{if .Connected}}Connected{{else}}Not connected{{end}}</title>
<style>body{font:16px/1.5 system-ui,sans-serif;max-width:32em;margin:4em auto;padding:0 1em;color:#222}
h1{font-size:1.4em}code{background:#f3f3f3;padding:0 .2em}</style></head>
<body><h1>{{if .Connected}}&#10003; {{.Connection}} is connected{{else}}{{if .Connection}}{{.Connection}} is not connected{{else}}Not connected{{end}}{{end}}</h1>
<p>{{.Message}}</p><p><small>Status: <code>{{.Code}}</code></small></p></body></html>
`))

// page answers a browser with a small HTML page, and any other client
// (Accept without text/html) with the JSON error shape.
func (s *Server) page(w http.ResponseWriter, r *http.Request, status int, o outcome) {
	if !strings.Contains(r.Header.Get("Accept"), "text/html") {
		if o.connected {
			writeJSON(w, status, map[string]string{"connection": o.Connection, "status": "connected", "code": o.Code})
			return
		}
		writeJSON(w, status, errorBody{Error: o.Message, Code: o.Code, Connection: o.Connection})
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'")
	w.WriteHeader(status)
	_ = pageTmpl.Execute(w, struct {
		Connected        bool
		Connection, Code string
		Message          string
	}{o.connected, o.Connection, o.Code, o.Message})
}
