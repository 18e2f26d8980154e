package httpapi

import (
	"html/template"
	"net/http"
	"strings"
)

// outcome is how a browser flow ended: a small page, or a return_to redirect.
type outcome struct {
	httpStatus int
	Connected  bool // only in the control build (storeAtCallback)
	Connection string
	Code       string // pending, or what went wrong
	Message    string // for people; never a token
	result     string // the pending result's code (a secret): only ever in return_to
}

var pageTmpl = template.Must(template.New("page").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">
<title>{{if .Connected}}Connected{{else}}Not connected{{end}}</title>
<style>body{font:16px/1.5 system-ui,sans-serif;max-width:32em;margin:4em auto;padding:0 1em;color:#222}
h1{font-size:1.4em}code{background:#f3f3f3;padding:0 .2em}</style></head>
<body><h1>{{if .Connected}}&#10003; {{.Connection}} is connected{{else}}{{if .Connection}}{{.Connection}} is not connected{{else}}Not connected{{end}}{{end}}</h1>
<p>{{.Message}}</p><p><small>Status: <code>{{.Code}}</code></small></p></body></html>
`))

// page answers a browser with a small HTML page, other clients in JSON.
func (s *Server) page(w http.ResponseWriter, r *http.Request, status int, o outcome) {
	if !strings.Contains(r.Header.Get("Accept"), "text/html") {
		if o.Connected {
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
	_ = pageTmpl.Execute(w, o)
}

type consent struct {
	App, Connection, Provider string
	ReturnHost                string
	Session, CSRF             string
}

var consentTmpl = template.Must(template.New("consent").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">
<title>Connect {{.Connection}}</title>
<style>body{font:16px/1.5 system-ui,sans-serif;max-width:32em;margin:4em auto;padding:0 1em;color:#222}
h1{font-size:1.4em}code{background:#f3f3f3;padding:0 .2em}button{font-size:1em;padding:.4em 1.2em}</style></head>
<body><h1>Connect <code>{{.Connection}}</code></h1>
<p>The application <strong>{{if .App}}{{.App}}{{else}}(unnamed){{end}}</strong> asks to connect your account at
{{if .Provider}}<strong>{{.Provider}}</strong>{{else}}the provider{{end}} as its connection <code>{{.Connection}}</code>{{if .ReturnHost}}, and then to send you back to <strong>{{.ReturnHost}}</strong>{{end}}.</p>
<p>Continue only if you asked for this yourself, in that application. If someone sent you this link, close this page.</p>
<form method="post" action="/oauth/connect">
<input type="hidden" name="session" value="{{.Session}}"><input type="hidden" name="csrf" value="{{.CSRF}}">
<button type="submit">Continue to {{if .Provider}}{{.Provider}}{{else}}the provider{{end}}</button></form></body></html>
`))

// consentPage shows the button that starts the flow: never framed
// (clickjacking), posting only to this origin.
func (s *Server) consentPage(w http.ResponseWriter, c consent) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Referrer-Policy", "no-referrer")
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'")
	w.WriteHeader(http.StatusOK)
	_ = consentTmpl.Execute(w, c)
}
