package soak

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"

	"github.com/jackc/pgx/v5"
	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/infra/dpop"
	"github.com/tokenguard/tokenguard/internal/sandbox"
)

// dpopConnection's grant is bound to a DPoP key (RFC 9449): the sandbox
// refuses its refreshes and resource calls without a proof of that key,
// so every app signs with the key it reads from the store. Its rotations
// must hold as the bearer connections' do (its row of the table).
const dpopConnection = "hooli-dpop"

// importGrant gives name a new grant (tokenctl import); dpopConnection's
// is bound to a new key, imported with it (--dpop-key-file), as a new
// grant brings a new key.
func (s *soak) importGrant(ctx context.Context, name string) error {
	cfg := s.sb.OAuth2Config(s.sbURL)
	args := []string{"import", "--connection", name}
	if name == dpopConnection {
		key, err := dpop.Generate()
		if err != nil {
			return err
		}
		hc := &http.Client{Transport: &dpop.TokenTransport{Nonces: &dpop.Nonces{}}}
		ctx = dpop.WithKey(context.WithValue(ctx, oauth2.HTTPClient, hc), key)
		f, err := os.CreateTemp("", "soak-dpop-key-*.pem")
		if err != nil {
			return err
		}
		defer os.Remove(f.Name())
		_, werr := f.Write(key.MarshalPEM())
		if err := f.Close(); err != nil || werr != nil {
			return fmt.Errorf("dpop key file: %v %v", werr, err)
		}
		args = append(args, "--dpop-key-file", f.Name())
	}
	tok, err := sandbox.Grant(ctx, cfg)
	if err != nil {
		return err
	}
	js, _ := json.Marshal(tok)
	_, err = s.tokenctl(ctx, bytes.NewReader(js), args...)
	return err
}

// dpopInvariant is the bound connection's row: its rotated refresh
// tokens never presented twice, every rotation the provider made stored
// or logged lost, no proof of the apps refused, and refreshes made at
// all (a bound grant nobody refreshed proves nothing).
func (s *soak) dpopInvariant(ctx context.Context, rep *Report) {
	var stored int64
	if err := s.query(ctx, func(ctx context.Context, c *pgx.Conn) error {
		return c.QueryRow(ctx, `SELECT count(*) FROM soak_rotations r JOIN tokenguard_connections c ON c.id = r.connection_id WHERE c.name = $1`,
			dpopConnection).Scan(&stored)
	}); err != nil {
		rep.Problems = append(rep.Problems, "reading soak_rotations: "+err.Error())
	}
	dropped := 0
	for _, e := range rep.Dropped {
		if e.Connection == dpopConnection {
			dropped++
		}
	}
	rep.Invariants = append(rep.Invariants, dpopRow(rep.Provider, stored, dropped))
}

// dpopRow judges the bound connection's counts.
func dpopRow(p sandbox.Stats, stored int64, dropped int) Invariant {
	lost := p.DPoPRefreshes - stored - int64(dropped)
	return Invariant{Name: "DPoP-bound " + dpopConnection + ": reuse, lost, refused proofs",
		OK: p.DPoPReuse == 0 && lost == 0 && p.DPoPRefused == 0 && p.DPoPRefreshes > 0,
		Value: fmt.Sprintf("%d reuse; %d rotations = %d stored + %d dropped (logged), %d unaccounted; %d proofs refused",
			p.DPoPReuse, p.DPoPRefreshes, stored, dropped, lost, p.DPoPRefused)}
}
