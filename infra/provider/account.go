package provider

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/domain"
)

// AccountSource finds the account that granted a token: the ID token's sub,
// else a user-info field when UserInfoURL is set, else "". The ID token came
// from the token endpoint over TLS, which OIDC Core 3.1.3.7 (6) accepts in
// place of checking its signature.
type AccountSource struct {
	UserInfoURL string
	IDField     string // default "sub"
	HTTP        *http.Client
}

// Account returns the account id, "" when it cannot be known.
func (a AccountSource) Account(ctx context.Context, tok *oauth2.Token) (id string, err error) {
	if raw, ok := tok.Extra("id_token").(string); ok && raw != "" {
		parts := strings.Split(raw, ".")
		if len(parts) != 3 {
			return "", errors.New("id_token is not a JWT")
		}
		payload, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
		if err != nil {
			return "", errors.New("id_token payload is not base64url")
		}
		var claims struct {
			Sub string `json:"sub"`
		}
		if err := json.Unmarshal(payload, &claims); err != nil || claims.Sub == "" {
			return "", errors.New("id_token has no sub claim")
		}
		id = claims.Sub
	} else if a.UserInfoURL != "" {
		id, err = a.userInfo(ctx, tok)
	}
	if err != nil {
		return "", err
	}
	// It came from outside and is stored, logged and shown: bounded.
	if err := domain.ValidateAccount(id); err != nil {
		return "", err
	}
	return id, nil
}

func (a AccountSource) userInfo(ctx context.Context, tok *oauth2.Token) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.UserInfoURL, nil)
	if err != nil {
		return "", fmt.Errorf("user-info request: %w", err)
	}
	req.Header.Set("Accept", "application/json")
	tok.SetAuthHeader(req)
	resp, err := cmp.Or(a.HTTP, http.DefaultClient).Do(req)
	if err != nil {
		return "", errors.New("user-info endpoint unreachable")
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("user-info endpoint answered %d", resp.StatusCode)
	}
	var fields map[string]any
	dec := json.NewDecoder(io.LimitReader(resp.Body, 1<<20))
	dec.UseNumber()
	if err := dec.Decode(&fields); err != nil {
		return "", errors.New("user-info answer is not a JSON object")
	}
	field := cmp.Or(a.IDField, "sub")
	switch v := fields[field].(type) {
	case string:
		if v != "" {
			return v, nil
		}
	case json.Number:
		return v.String(), nil
	}
	return "", fmt.Errorf("user-info answer has no %q", field)
}
