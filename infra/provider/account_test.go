package provider

import (
	"context"
	"testing"

	"golang.org/x/oauth2"
)

func TestIDTokenSubject(t *testing.T) {
	// header.payload.signature; the payload is {"sub":"user-42","aud":"c"}.
	raw := "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ1c2VyLTQyIiwiYXVkIjoiYyJ9.c2ln"
	tok := (&oauth2.Token{AccessToken: "a"}).WithExtra(map[string]any{"id_token": raw})
	if got, err := (AccountSource{}).Account(context.Background(), tok); err != nil || got != "user-42" {
		t.Errorf("Account = %q, %v", got, err)
	}
	tok = (&oauth2.Token{AccessToken: "a"}).WithExtra(map[string]any{"id_token": "not-a-jwt"})
	if _, err := (AccountSource{}).Account(context.Background(), tok); err == nil {
		t.Error("a malformed id_token was accepted")
	}
	if got, err := (AccountSource{}).Account(context.Background(), &oauth2.Token{AccessToken: "a"}); err != nil || got != "" {
		t.Errorf("no id_token, no user-info URL: %q, %v", got, err)
	}
}
