package di

import (
	"fmt"
	"io"
	"reflect"
	"slices"
	"strings"

	"github.com/agnivade/levenshtein"
)

// HelpAsked reports whether args ask for help: -h, -help or --help.
func HelpAsked(args []string) bool {
	return slices.ContainsFunc(args, func(a string) bool { return a == "-h" || a == "-help" || a == "--help" })
}

// PrintEnv writes the environment variables settings (Config, AppConfig) reads, with their defaults, from its
// env tags: the one list of them. traced: the app also reads OpenTelemetry's OTEL_* variables.
func PrintEnv(w io.Writer, settings any, traced bool) {
	fmt.Fprintln(w, "\nEnvironment (docs/configuration.md):")
	for _, v := range envVars(reflect.TypeOf(settings), "") {
		fmt.Fprintf(w, "  %s%s\n", v.name, v.note)
	}
	if traced {
		fmt.Fprintln(w, "  OTEL_* (OpenTelemetry's exporter settings; traces are off unless OTEL_TRACES_EXPORTER is set)")
	}
}

type envVar struct{ field, name, note string }

// envVars are the variables t's env tags name after prefix, in field order, with default or "(required)".
func envVars(t reflect.Type, prefix string) (out []envVar) {
	for f := range t.Fields() {
		if p, ok := f.Tag.Lookup("envPrefix"); ok {
			out = append(out, envVars(f.Type, prefix+p)...)
		} else if f.Anonymous && f.Type.Kind() == reflect.Struct {
			out = append(out, envVars(f.Type, prefix)...)
		} else if name, opts, _ := strings.Cut(f.Tag.Get("env"), ","); name != "" {
			note := ""
			if def, ok := f.Tag.Lookup("envDefault"); ok {
				note = " (default " + def + ")"
			} else if strings.Contains(opts, "required") {
				note = " (required)"
			}
			out = append(out, envVar{f.Name, prefix + name, note})
		}
	}
	return out
}

// knownVars are the names of every setting, from the env tags; ourPrefixes their first words (OAUTH_, TOKEN_,
// ...): a variable that starts with one looks like a setting.
var knownVars, ourPrefixes = func() (names, prefixes []string) {
	for _, v := range envVars(reflect.TypeFor[AppConfig](), "") {
		names = append(names, v.name)
		if i := strings.IndexByte(v.name, '_'); i > 0 {
			prefixes = append(prefixes, v.name[:i+1])
		}
	}
	slices.Sort(names)
	slices.Sort(prefixes)
	return slices.Compact(names), slices.Compact(prefixes)
}()

// envWarning is one start-up warning. It names variables, never values.
type envWarning struct {
	Variable string
	Message  string
}

// envWarnings finds in environ the variables that look like settings but are none (a typo silently leaves the
// setting at its default) and, when the client secret is needed, an empty OAUTH_CLIENT_SECRET.
func envWarnings(environ []string, secretNeeded bool) []envWarning {
	var out []envWarning
	secret := ""
	for _, kv := range environ {
		name, value, _ := strings.Cut(kv, "=")
		if name == "OAUTH_CLIENT_SECRET" {
			secret = value
		}
		upper := strings.ToUpper(name)
		// HTTP_PROXY (or http_proxy) shares our prefix but is Go's HTTP client's.
		if _, known := slices.BinarySearch(knownVars, name); known || upper == "HTTP_PROXY" {
			continue
		}
		near := closest(upper)
		if near == "" && !slices.ContainsFunc(ourPrefixes, func(p string) bool { return strings.HasPrefix(upper, p) }) {
			continue
		}
		msg := name + " is not a tokenguard setting and is ignored"
		if near != "" {
			msg += fmt.Sprintf("; did you mean %s?", near)
		}
		out = append(out, envWarning{Variable: name, Message: msg})
	}
	if secretNeeded && strings.TrimSpace(secret) == "" {
		out = append(out, envWarning{Variable: "OAUTH_CLIENT_SECRET",
			Message: "OAUTH_CLIENT_SECRET is empty: the token endpoint will reject a confidential client (invalid_client)"})
	}
	return out
}

// closest is the known name within a typo (2 edits, or a fifth of a long name) of name.
func closest(name string) string {
	best, bestDist := "", 0
	for _, k := range knownVars {
		if d := levenshtein.ComputeDistance(name, k); best == "" || d < bestDist {
			best, bestDist = k, d
		}
	}
	if bestDist <= max(2, len(best)/5) {
		return best
	}
	return ""
}
