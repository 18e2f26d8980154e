package domain

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"time"
)

// Metadata is the application's own bookkeeping about a connection, never
// acted on; kept apart from Token, which the hot path needs small and comparable.
type Metadata struct {
	Object json.RawMessage // a JSON object, compact; empty reads as {}
	Tags   []string
}

// Bounds of Metadata: its compact JSON object, its tags and a tag's length.
const (
	MaxMetadataBytes = 16 << 10
	MaxTags          = 32
	MaxTagLength     = 64
)

// ErrInvalidMetadata: metadata not a JSON object, too large, or with too many or malformed tags. Nothing was stored.
var ErrInvalidMetadata = errors.New("invalid connection metadata")

var tagPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:/=@+-]*$`)

// nulEscape is JSON's only spelling of U+0000: \u0000 after an even number of backslashes.
var nulEscape = regexp.MustCompile(`(?:^|[^\\])(?:\\\\)*\\u0000`)

// NewMetadata checks object (empty means {}) and tags and returns them compacted,
// without repeated tags. Errors quote no input beyond a tag's position.
func NewMetadata(object []byte, tags []string) (Metadata, error) {
	m := Metadata{Object: json.RawMessage("{}")}
	if len(bytes.TrimSpace(object)) > 0 {
		var buf bytes.Buffer
		if err := json.Compact(&buf, object); err != nil {
			return Metadata{}, fmt.Errorf("%w: not valid JSON", ErrInvalidMetadata)
		}
		if buf.Len() == 0 || buf.Bytes()[0] != '{' {
			return Metadata{}, fmt.Errorf("%w: want a JSON object ({...})", ErrInvalidMetadata)
		}
		if buf.Len() > MaxMetadataBytes {
			return Metadata{}, fmt.Errorf("%w: %d bytes, at most %d", ErrInvalidMetadata, buf.Len(), MaxMetadataBytes)
		}
		if nulEscape.Match(buf.Bytes()) {
			// Postgres's jsonb has no NUL: refused here, not as a store error.
			return Metadata{}, fmt.Errorf("%w: a key or string holds a NUL character (\\u0000)", ErrInvalidMetadata)
		}
		m.Object = buf.Bytes()
	}
	for i, t := range tags {
		if len(t) > MaxTagLength || !tagPattern.MatchString(t) {
			return Metadata{}, fmt.Errorf("%w: tag %d: want 1-%d of A-Z a-z 0-9 . _ : / = @ + -, starting with a letter or digit",
				ErrInvalidMetadata, i+1, MaxTagLength)
		}
		if !slices.Contains(m.Tags, t) {
			m.Tags = append(m.Tags, t)
		}
	}
	if len(m.Tags) > MaxTags {
		return Metadata{}, fmt.Errorf("%w: %d tags, at most %d", ErrInvalidMetadata, len(m.Tags), MaxTags)
	}
	return m, nil
}

// Connection is what listings show of a connection. It never holds a token.
type Connection struct {
	Name          string
	Provider      string // "" for the provider of the environment (OAUTH_*)
	Status        Status
	StatusReason  string
	Expiry        time.Time // of the access token; zero: none given
	RefreshExpiry time.Time // zero: unknown
	ObtainedAt    time.Time // the last refresh or grant
	Version       int64
	UpdatedAt     time.Time
	Binding       Binding
	Metadata      Metadata
	Failure       RefreshFailure // this version's; once shown as failing, Status is StatusFailing and StatusReason says why
	DPoPJKT       string         // thumbprint of the grant's DPoP key; "" for a bearer grant
}
