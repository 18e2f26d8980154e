package di

import (
	"fmt"
	"io"
	"reflect"
	"slices"
	"strings"
)

// HelpAsked reports whether args ask for help: -h, -help or --help.
func HelpAsked(args []string) bool {
	return slices.ContainsFunc(args, func(a string) bool { return a == "-h" || a == "-help" || a == "--help" })
}

// PrintEnv writes the environment variables settings (Config, AppConfig)
// reads, with their defaults, from its env tags: the one list of them.
// traced: the app also reads OpenTelemetry's OTEL_* variables.
func PrintEnv(w io.Writer, settings any, traced bool) {
	fmt.Fprintln(w, "\nEnvironment (docs/configuration.md):")
	for _, v := range envVars(reflect.TypeOf(settings)) {
		fmt.Fprintf(w, "  %s%s\n", v.name, v.note)
	}
	if traced {
		fmt.Fprintln(w, "  OTEL_* (OpenTelemetry's exporter settings; traces are off unless OTEL_TRACES_EXPORTER is set)")
	}
}

type envVar struct{ field, name, note string }

// envVars are the variables t's env tags name, in field order, with default or "(required)".
func envVars(t reflect.Type) []envVar {
	var out []envVar
	var walk func(t reflect.Type, prefix string)
	walk = func(t reflect.Type, prefix string) {
		for f := range t.Fields() {
			if p, ok := f.Tag.Lookup("envPrefix"); ok {
				walk(f.Type, prefix+p)
			} else if f.Anonymous && f.Type.Kind() == reflect.Struct {
				walk(f.Type, prefix)
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
	}
	walk(t, "")
	return out
}
