package console

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"html/template"
	"maps"
	"math"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/httpapi/problem"
)

// connectionRow is one line of the connections table.
type connectionRow struct {
	domain.Connection
	Last *domain.ConnectionEvent // its last refresh, if any is recorded
}

// statusPattern bounds a status filter: a stored status or expiring_soon.
var statusPattern = regexp.MustCompile(`^[a-z_]{1,32}$`)

func (c *Console) connections(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := domain.ConnectionFilter{Status: domain.Status(q.Get("status")), Provider: q.Get("provider"),
		Tag: strings.TrimSpace(q.Get("tag")), NamePrefix: strings.TrimSpace(q.Get("prefix"))}
	after := q.Get("after")
	switch {
	case f.Status != "" && !statusPattern.MatchString(string(f.Status)),
		f.Provider != "" && f.Provider != domain.EnvProvider && domain.ValidateName(f.Provider) != nil,
		len(f.Tag) > 128, len(f.NamePrefix) > 128,
		after != "" && domain.ValidateName(after) != nil:
		c.fail(w, r, http.StatusBadRequest, "That filter is not valid.")
		return
	}
	page, next, err := Visible(r.Context(), c.d.Connections, sessionOf(r).KeyAccess, f, after, pageSize)
	if err != nil {
		c.failed(w, r, "", err)
		return
	}
	keep := url.Values{"status": {string(f.Status)}, "provider": {f.Provider}, "tag": {f.Tag}, "prefix": {f.NamePrefix}}
	maps.DeleteFunc(keep, func(_ string, v []string) bool { return v[0] == "" })
	filtered, firstURL, nextURL := len(keep) > 0, "", ""
	if after != "" {
		firstURL = strings.TrimSuffix("/console/connections?"+keep.Encode(), "?")
	}
	if next != "" {
		keep.Set("after", next)
		nextURL = "/console/connections?" + keep.Encode()
	}
	names := make([]string, len(page))
	for i, p := range page {
		names[i] = p.Name
	}
	last, err := c.d.History.LastRefreshes(r.Context(), names)
	if err != nil {
		c.failed(w, r, "", err)
		return
	}
	rows := make([]connectionRow, len(page))
	for i, p := range page {
		rows[i] = connectionRow{Connection: p}
		if e, ok := last[p.Name]; ok {
			rows[i].Last = &e
		}
	}
	provs, err := c.d.Providers(r.Context())
	if err != nil {
		c.failed(w, r, "", err)
		return
	}
	c.render(w, r, http.StatusOK, "connections", map[string]any{
		"Nav": "connections", "Filter": f, "Rows": rows, "Next": nextURL, "First": firstURL, "Providers": provs,
		"Filtered": filtered, "Statuses": []string{"active", "failing", "needs_reauth", string(domain.StatusExpiringSoon)},
	})
}

// withConn runs page with the path's connection, or answers why there is none.
func (c *Console) withConn(page func(http.ResponseWriter, *http.Request, domain.Connection)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		conn, err := c.d.Connections.Connection(r.Context(), r.PathValue("name"))
		if err != nil {
			c.failed(w, r, r.PathValue("name"), err)
			return
		}
		page(w, r, conn)
	}
}

func (c *Console) connection(w http.ResponseWriter, r *http.Request, conn domain.Connection) {
	name := r.PathValue("name")
	events, err := c.d.History.Recent(r.Context(), name, 100)
	if err != nil {
		c.failed(w, r, name, err)
		return
	}
	for i, e := range events {
		if e.Kind == "refresh" && e.Outcome == "not_stored" && e.Reason == "" {
			// Written by a release that recorded no reason.
			events[i].Reason = "not stored (reason not recorded)"
		}
	}
	c.render(w, r, http.StatusOK, "connection", map[string]any{
		"Nav": "connections", "C": conn, "Events": events, "Metadata": indentJSON(conn.Metadata.Object),
		"Done": doneMessages[r.URL.Query().Get("done")], "FailingNow": failingNow(events),
	})
}

// failingNow is the last refresh (events are newest first) if it failed
// without marking the grant dead, while the status still says active.
func failingNow(events []domain.ConnectionEvent) *domain.ConnectionEvent {
	i := slices.IndexFunc(events, func(e domain.ConnectionEvent) bool { return e.Kind == "refresh" })
	if i < 0 || events[i].Outcome == "ok" || events[i].Outcome == "needs_reauth" {
		return nil
	}
	return &events[i]
}

// doneMessages are the fixed notices per action: nothing of the URL is echoed.
var doneMessages = map[string]string{
	"reactivated":    "Reactivated: the connection is active again; its next refresh tells whether the grant is alive.",
	"already_active": "The connection was not marked needs_reauth: nothing changed.",
}

func (c *Console) reconnect(w http.ResponseWriter, r *http.Request, conn domain.Connection) {
	name := r.PathValue("name")
	returnTo := r.PostFormValue("return_to")
	link, expires, err := c.d.Links.ConnectLink(r.Context(), name, conn.Provider, sessionOf(r).Name, returnTo)
	if err != nil {
		c.failed(w, r, name, err)
		return
	}
	c.d.Log.Info("console: reconnect link created", "connection", name, "api_key", sessionOf(r).Name, "expires_at", expires)
	c.render(w, r, http.StatusOK, "reconnect", map[string]any{"Nav": "connections", "C": conn, "Link": link, "Expires": expires, "ReturnTo": returnTo})
}

func (c *Console) reactivate(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	_, version, err := c.d.Actions.Reactivate(r.Context(), name, "")
	if err != nil {
		c.failed(w, r, name, err)
		return
	}
	done := "reactivated"
	if version == 0 {
		done = "already_active"
	}
	c.d.Log.Info("console: reactivate", "connection", name, "api_key", sessionOf(r).Name, "version", version)
	http.Redirect(w, r, "/console/connections/"+url.PathEscape(name)+"?done="+done, http.StatusSeeOther)
}

func (c *Console) confirmDisconnect(w http.ResponseWriter, r *http.Request, conn domain.Connection) {
	c.render(w, r, http.StatusOK, "disconnect", map[string]any{"Nav": "connections", "C": conn})
}

func (c *Console) disconnect(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if r.PostFormValue("confirm") != name {
		// Not from the confirmation page: ask there.
		http.Redirect(w, r, "/console/connections/"+url.PathEscape(name)+"/disconnect", http.StatusSeeOther)
		return
	}
	revoke := r.PostFormValue("revoke") == "on"
	if _, err := c.d.Actions.Disconnect(r.Context(), name, revoke); err != nil {
		c.failed(w, r, name, err)
		return
	}
	c.d.Log.Info("console: disconnect", "connection", name, "api_key", sessionOf(r).Name, "revoke", revoke)
	c.render(w, r, http.StatusOK, "disconnected", map[string]any{"Nav": "connections", "Name": name, "Revoked": revoke})
}

// providerRow is a provider with its last hour of refreshes.
type providerRow struct {
	Provider
	Rate domain.RefreshRate
}

func (c *Console) providers(w http.ResponseWriter, r *http.Request) {
	provs, err := c.d.Providers(r.Context())
	if err != nil {
		c.failed(w, r, "", err)
		return
	}
	rates, err := c.d.History.RefreshRates(r.Context(), c.d.Now().Add(-time.Hour))
	if err != nil {
		c.failed(w, r, "", err)
		return
	}
	rows := make([]providerRow, len(provs))
	for i, p := range provs {
		rows[i] = providerRow{Provider: p, Rate: rates[p.Name]}
	}
	c.render(w, r, http.StatusOK, "providers", map[string]any{"Nav": "providers", "Rows": rows})
}

// failed answers err with its page from problem.Of, as the API does.
func (c *Console) failed(w http.ResponseWriter, r *http.Request, name string, err error) {
	p := problem.Of(err)
	if p.Status >= 500 {
		c.d.Log.Error("console request failed", "path", r.URL.Path, "connection", name, "err", err)
	}
	c.fail(w, r, p.Status, p.Page)
}

func (c *Console) fail(w http.ResponseWriter, r *http.Request, status int, msg string) {
	c.render(w, r, status, "error", map[string]any{"Nav": "", "Status": status, "StatusText": http.StatusText(status), "Message": msg})
}

// render writes page with data, adding what the layout needs.
func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, page string, data map[string]any) {
	if s := sessionOf(r); !s.token.IsZero() {
		data["Session"], data["CSRF"] = s, s.CSRF
	}
	var buf bytes.Buffer
	if err := c.pages[page].ExecuteTemplate(&buf, "layout", data); err != nil {
		c.d.Log.Error("console template failed", "page", page, "err", err)
		http.Error(w, "console page failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

func indentJSON(raw json.RawMessage) string {
	var buf bytes.Buffer
	if len(raw) == 0 || json.Indent(&buf, raw, "", "  ") != nil {
		return "{}"
	}
	return buf.String()
}

// The badges' CSS classes of statuses and outcomes; any other is "warn".
var (
	statusBadges  = map[domain.Status]string{domain.StatusActive: "ok", domain.StatusNeedsReauth: "bad"}
	outcomeBadges = map[string]string{"ok": "ok", "connected": "ok", "recovered": "ok",
		"needs_reauth": "bad", "disconnected": "bad", "rolled_back": "bad", "": "muted"}
)

func parsePages() map[string]*template.Template {
	funcs := template.FuncMap{
		"when": func(t time.Time) string { // how far t is from now ("in 3m", "5s ago"; "—" for zero)
			switch d := time.Until(t); {
			case t.IsZero():
				return "—"
			case d >= 0:
				return "in " + short(d)
			default:
				return short(-d) + " ago"
			}
		},
		"absolute": func(t time.Time) string {
			if t.IsZero() {
				return ""
			}
			return t.UTC().Format("2006-01-02 15:04:05 UTC")
		},
		"duration": func(d time.Duration) string {
			switch {
			case d <= 0:
				return "—"
			case d < time.Second:
				return fmt.Sprintf("%d ms", d.Milliseconds())
			}
			return fmt.Sprintf("%.1f s", d.Seconds())
		},
		"percent": func(r domain.RefreshRate) string {
			if r.Total == 0 {
				return "no refreshes"
			}
			return fmt.Sprintf("%.0f%%", math.Floor(100*float64(r.OK)/float64(r.Total)))
		},
		"join":    strings.Join,
		"status":  func(s domain.Status) string { return cmp.Or(statusBadges[s], "warn") },
		"outcome": func(o string) string { return cmp.Or(outcomeBadges[o], "warn") },
		"soon":    func(t time.Time) bool { return !t.IsZero() && time.Until(t) < domain.ExpiringSoonWithin },
	}
	pages := map[string]*template.Template{}
	for _, p := range []string{"login", "connections", "connection", "reconnect", "disconnect", "disconnected", "providers", "error"} {
		pages[p] = template.Must(template.New(p).Funcs(funcs).ParseFS(assets, "assets/layout.html", "assets/"+p+".html"))
	}
	return pages
}

// short is d in its largest unit, rounded: 59m40s is "1h", 4d23h "5d".
func short(d time.Duration) string {
	switch {
	case d.Round(time.Second) < time.Second:
		return "now"
	case d.Round(time.Second) < time.Minute:
		return fmt.Sprintf("%ds", d.Round(time.Second)/time.Second)
	case d.Round(time.Minute) < time.Hour:
		return fmt.Sprintf("%dm", d.Round(time.Minute)/time.Minute)
	case d.Round(time.Hour) < 48*time.Hour:
		return fmt.Sprintf("%dh", d.Round(time.Hour)/time.Hour)
	}
	return fmt.Sprintf("%dd", d.Round(24*time.Hour)/(24*time.Hour))
}
