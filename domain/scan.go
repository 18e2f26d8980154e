package domain

import "strings"

// ConnectionScan is what a store may narrow a listing to for one pattern of a
// key, so that a listing costs what it returns; AllowsConnection still decides.
type ConnectionScan struct {
	Prefix string // the names start with it ("" for any)
	Exact  bool   // the pattern is the one name Prefix
	Regexp string // the pattern as an anchored regexp RE2 and PostgreSQL read alike; "" when it is Prefix*
}

// ConnectionScans are the scans of the key's patterns, or all when it may see every
// connection. Malformed patterns, which match nothing, are left out.
func (a KeyAccess) ConnectionScans() (scans []ConnectionScan, all bool) {
	if a.Connections == nil {
		return nil, true
	}
	for _, p := range a.Connections {
		if ValidateConnectionPattern(p) != nil {
			continue
		}
		s := scanOf(p)
		if s.Prefix == "" && s.Regexp == "" {
			return nil, true // *
		}
		scans = append(scans, s)
	}
	return scans, false
}

// scanOf reads a well-formed path.Match pattern.
func scanOf(p string) ConnectionScan {
	var prefix, re strings.Builder
	re.WriteString("^")
	wild := len(p) // where the first wildcard is
	for i := 0; i < len(p); i++ {
		c := p[i]
		if c == '*' || c == '?' || c == '[' {
			wild = min(wild, i)
		}
		switch c {
		case '*':
			re.WriteString("[^/]*")
		case '?':
			re.WriteString("[^/]")
		case '[':
			i = class(p, i+1, &re)
		default:
			if c == '\\' {
				i++
				c = p[i]
			}
			if i < wild {
				prefix.WriteByte(c)
			}
			re.WriteString(quoteRegexp(c))
		}
	}
	re.WriteString("$")
	s := ConnectionScan{Prefix: prefix.String(), Exact: wild == len(p), Regexp: re.String()}
	if strings.Trim(p[wild:], "*") == "" {
		s.Regexp = "" // the prefix is the pattern: name = prefix, or prefix followed by anything
	}
	return s
}

// class writes the character class of p from i (after its '[') and returns the index of its ']'.
// An inverted range matches nothing in path.Match and no regexp takes it, so it is left out;
// an empty class matches '/', which no name has (negated: any character).
func class(p string, i int, re *strings.Builder) int {
	re.WriteString("[")
	if p[i] == '^' {
		re.WriteString("^")
		i++
	}
	empty := true
	for p[i] != ']' { // path.Match refuses a class that opens with ']'
		lo, next := classChar(p, i)
		hi := lo
		i = next
		if p[i] == '-' {
			hi, i = classChar(p, i+1)
		}
		if lo <= hi {
			empty = false
			re.WriteString(quoteRegexp(lo))
			if hi != lo {
				re.WriteString("-" + quoteRegexp(hi))
			}
		}
	}
	if empty {
		re.WriteString(`\/`)
	}
	re.WriteString("]")
	return i
}

func classChar(p string, i int) (byte, int) {
	if p[i] == '\\' {
		return p[i+1], i + 2
	}
	return p[i], i + 1
}

// quoteRegexp escapes every non-alphanumeric c, which both syntaxes then read as c, in a class too.
func quoteRegexp(c byte) string {
	if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' {
		return string(c)
	}
	return `\` + string(c)
}
