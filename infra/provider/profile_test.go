package provider

import (
	"context"
	"errors"
	"testing"

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
		{"control: the same answer without the profile", "generic", reply{200, "application/json", nil, `{"error":"bad_refresh_token"}`}, domain.Transient, "unrecognized_error"},
		{"github: the code with another status is not the profile's", "github", reply{403, "application/json", nil, `{"error":"bad_refresh_token"}`}, domain.Transient, "unrecognized_error"},
		{"github dead grant as a form (legacy answer)", "github", reply{200, "application/x-www-form-urlencoded", nil, `error=bad_refresh_token&error_description=x`}, domain.GrantDead, "bad_refresh_token"},
		{"slack", "slack", reply{200, "application/json", nil, `{"ok":false,"error":"invalid_refresh_token"}`}, domain.GrantDead, "invalid_refresh_token"},
		{"hubspot", "hubspot", reply{400, "application/json", nil, `{"status":"BAD_REFRESH_TOKEN","message":"missing or invalid refresh token"}`}, domain.GrantDead, "BAD_REFRESH_TOKEN"},
		{"a 200 without an access token", "github", reply{200, "application/json", nil, `{"token_type":"bearer"}`}, domain.Transient, ""},
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
