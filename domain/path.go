package domain

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"unicode/utf8"
)

// ErrUnsafePath: a path that some parser could read as another path. Nothing was sent.
var ErrUnsafePath = errors.New("the path could be read as another path")

// maxDecodes bounds CheckPath's percent-decoding rounds.
const maxDecodes = 8

// CheckPath is the one path check of the proxy, the clients and return_to: p is
// refused when, after any number of percent-decodings, a segment is "." or ".."
// (also before a ";"), or p holds a backslash, a control byte or invalid UTF-8.
func CheckPath(p string) error {
	for range maxDecodes {
		if err := checkLayer(p); err != nil {
			return err
		}
		dec, err := url.PathUnescape(p)
		if err != nil {
			return fmt.Errorf("%w: a malformed percent-escape", ErrUnsafePath)
		}
		if dec == p {
			return nil
		}
		p = dec
	}
	return fmt.Errorf("%w: percent-encoded more than %d times", ErrUnsafePath, maxDecodes)
}

func checkLayer(p string) error {
	if !utf8.ValidString(p) {
		return fmt.Errorf("%w: not valid UTF-8", ErrUnsafePath)
	}
	if i := strings.IndexFunc(p, func(r rune) bool { return r < 0x20 || r == 0x7f || r == '\\' }); i >= 0 {
		if p[i] == '\\' {
			return fmt.Errorf("%w: a backslash", ErrUnsafePath)
		}
		return fmt.Errorf("%w: a control byte", ErrUnsafePath)
	}
	for seg := range strings.SplitSeq(p, "/") {
		seg, _, _ = strings.Cut(seg, ";")
		if seg == "." || seg == ".." {
			return fmt.Errorf("%w: a dot segment", ErrUnsafePath)
		}
	}
	return nil
}
