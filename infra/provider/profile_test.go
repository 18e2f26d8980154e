package provider

import (
	"context"
	"errors"
	"testing"
	"time"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/provider/profiles"
)

// A profile's own words for a dead grant count only with it, in its field
// and with its status; without the profile (generic) the same answer stays
// transient, and a 200 without an access token is never a success.
func TestProfileAnswers(t *testing.T) {
	cases := []struct {
		name, profile string
		reply         reply
		class         domain.ErrorClass
		code          string
	}{
		{"github dead grant in a 200", "github", reply{200, "application/json", nil, `{"error":"bad_refresh_token","error_description":"The refresh token passed is incorrect or expired."}`}, domain.GrantDead, "bad_refresh_token"},
		{"control: the same answer without the profile", "generic", reply{200, "application/json", nil, `{"error":"bad_refresh_token"}`}, domain.Unclassified, "unrecognized_error"},
		{"github: the code with another status is not the profile's", "github", reply{403, "application/json", nil, `{"error":"bad_refresh_token"}`}, domain.Unclassified, "unrecognized_error"},
		{"github dead grant as a form (legacy answer)", "github", reply{200, "application/x-www-form-urlencoded", nil, `error=bad_refresh_token&error_description=x`}, domain.GrantDead, "bad_refresh_token"},
		{"slack", "slack", reply{200, "application/json", nil, `{"ok":false,"error":"invalid_refresh_token"}`}, domain.GrantDead, "invalid_refresh_token"},
		{"hubspot", "hubspot", reply{400, "application/json", nil, `{"status":"BAD_REFRESH_TOKEN","message":"missing or invalid refresh token"}`}, domain.GrantDead, "BAD_REFRESH_TOKEN"},
		{"a 200 without an access token", "github", reply{200, "application/json", nil, `{"token_type":"bearer"}`}, domain.Unclassified, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEndpoint(t, func(seen) reply { return c.reply })
			p, err := profiles.Get(c.profile)
			if err != nil {
				t.Fatal(err)
			}
			_, err = NewRefresher(e.config(oauth2.AuthStyleInParams), nil, WithProfile(p)).Refresh(context.Background(), domain.NewSecret(testRefreshToken))
			var pe *domain.ProviderError
			if !errors.As(err, &pe) {
				t.Fatalf("err = %v, want *domain.ProviderError", err)
			}
			if pe.Class != c.class || pe.Code != c.code {
				t.Fatalf("class %v code %q, want %v %q", pe.Class, pe.Code, c.class, c.code)
			}
			if n := len(e.requests()); n != 1 {
				t.Fatalf("%d requests, want 1", n)
			}
		})
	}
}

func TestProfileExtraFields(t *testing.T) {
	e := newEndpoint(t, func(seen) reply {
		return reply{200, "application/json", nil, `{"access_token":"at","instance_url":"https://acme.my.salesforce.com","issued_at":"1700000000000","id":"https://login.salesforce.com/id/x/y"}`}
	})
	p, _ := profiles.Get("salesforce")
	g, err := NewRefresher(e.config(oauth2.AuthStyleInParams), nil, WithProfile(p)).Refresh(context.Background(), domain.NewSecret(testRefreshToken))
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Extra) != 1 || g.Extra["instance_url"] != "https://acme.my.salesforce.com" {
		t.Fatalf("extra = %v, want instance_url only", g.Extra)
	}
	g, err = NewRefresher(e.config(oauth2.AuthStyleInParams), nil).Refresh(context.Background(), domain.NewSecret(testRefreshToken))
	if err != nil || g.Extra != nil {
		t.Fatalf("without the profile: extra = %v, %v; want none", g.Extra, err)
	}
}

// The code exchange authenticates as a refresh does: in auto, HTTP Basic,
// the form body only after invalid_client (the code was not spent), the
// winner remembered for the refreshes; after any other refusal, never a
// second request.
func TestExchangeAuthStyle(t *testing.T) {
	e := newEndpoint(t, func(s seen) reply {
		if s.style != StyleParams {
			return reply{401, "application/json", nil, `{"error":"invalid_client"}`}
		}
		if s.grantType == "authorization_code" {
			return reply{200, "application/json", nil, `{"access_token":"at","refresh_token":"rt","id_token":"x.y.z"}`}
		}
		return reply{200, "application/json", nil, `{"access_token":"at2","expires_in":60}`}
	})
	r := NewRefresher(e.config(oauth2.AuthStyleAutoDetect), nil, WithDefaultLifetime(time.Hour))
	g, tok, err := r.Exchange(context.Background(), "code", "http://127.0.0.1/cb", "verifier")
	if err != nil {
		t.Fatal(err)
	}
	if g.RefreshToken.Reveal() != "rt" || time.Until(g.Expiry) < 59*time.Minute || tok.Extra("id_token") != "x.y.z" {
		t.Fatalf("grant %+v, id token %v: want the default lifetime and the answer's fields", g, tok.Extra("id_token"))
	}
	if got := e.requests(); len(got) != 2 || got[0].style != StyleHeader || got[1].style != StyleParams {
		t.Fatalf("requests %+v: want Basic, then the form body", got)
	}
	if _, err := r.Refresh(context.Background(), domain.NewSecret("rt")); err != nil || len(e.requests()) != 3 {
		t.Fatalf("refresh after the exchange: %v, %d requests; want the learned style at once", err, len(e.requests()))
	}

	dead := newEndpoint(t, func(seen) reply { return reply{400, "application/json", nil, `{"error":"invalid_grant"}`} })
	if _, _, err := NewRefresher(dead.config(oauth2.AuthStyleAutoDetect), nil).Exchange(context.Background(), "code", "", ""); err == nil || len(dead.requests()) != 1 {
		t.Fatalf("invalid_grant: %v after %d requests; want one", err, len(dead.requests()))
	}
}

// A profile's refresh calendar fills an answer that names no refresh
// expiry: the idle expiry from each refresh where that is all there is;
// at the consent, the absolute expiry where the profile knows one (the
// date announced ahead; the keep-alive handles the idle one), kept by
// every refresh after (KeepRefreshExpiry).
func TestProfileRefreshCalendar(t *testing.T) {
	e := newEndpoint(t, func(seen) reply {
		return reply{200, "application/json", nil, `{"access_token":"at","refresh_token":"rt2","expires_in":60}`}
	})
	day := 24 * time.Hour
	near := func(at time.Time, d time.Duration) bool { return at.Sub(time.Now().Add(d)).Abs() < time.Minute }
	for _, c := range []struct {
		profile            string
		refresh, exchanged time.Duration // 0: unknown
	}{
		{"xero", 60 * day, 60 * day},
		{"atlassian", 0, 365 * day},
		{"quickbooks", 0, 1825 * day},
		{"generic", 0, 0},
	} {
		p, _ := profiles.Get(c.profile)
		r := NewRefresher(e.config(oauth2.AuthStyleInHeader), nil, WithProfile(p))
		g, err := r.Refresh(context.Background(), domain.NewSecret("rt"))
		if err != nil || (c.refresh == 0) != g.RefreshExpiry.IsZero() || (c.refresh > 0 && !near(g.RefreshExpiry, c.refresh)) {
			t.Errorf("%s refresh: refresh expiry %v, %v; want in %v", c.profile, g.RefreshExpiry, err, c.refresh)
		}
		if keep := p.RefreshAbsolute.Known && p.RefreshAbsolute.D > 0; g.KeepRefreshExpiry != keep {
			t.Errorf("%s refresh: KeepRefreshExpiry %v, want %v", c.profile, g.KeepRefreshExpiry, keep)
		}
		g, _, err = r.Exchange(context.Background(), "code", "", "")
		if err != nil || (c.exchanged == 0) != g.RefreshExpiry.IsZero() || (c.exchanged > 0 && !near(g.RefreshExpiry, c.exchanged)) {
			t.Errorf("%s exchange: refresh expiry %v, %v; want in %v", c.profile, g.RefreshExpiry, err, c.exchanged)
		}
	}
}
