package di

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// startTracing reads the standard variables: none and nothing set install
// no SDK, console does, OTEL_TRACES_SAMPLER is the SDK's sampler, and an
// unknown exporter is a configuration error.
func TestStartTracing(t *testing.T) {
	prev, prevProp := otel.GetTracerProvider(), otel.GetTextMapPropagator()
	t.Cleanup(func() { otel.SetTracerProvider(prev); otel.SetTextMapPropagator(prevProp) })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tc := range []struct {
		name    string
		env     map[string]string
		sdk     bool
		sampled bool
		bad     bool
	}{
		{name: "nothing set", env: nil},
		{name: "none", env: map[string]string{"OTEL_TRACES_EXPORTER": "none"}},
		{name: "disabled", env: map[string]string{"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"}},
		{name: "console", env: map[string]string{"OTEL_TRACES_EXPORTER": "console"}, sdk: true, sampled: true},
		{name: "console, always_off", env: map[string]string{"OTEL_TRACES_EXPORTER": "console", "OTEL_TRACES_SAMPLER": "always_off"}, sdk: true},
		{name: "unknown exporter", env: map[string]string{"OTEL_TRACES_EXPORTER": "carrier-pigeon"}, bad: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			otel.SetTracerProvider(prev)
			var environ []string
			for _, k := range []string{"OTEL_TRACES_EXPORTER", "OTEL_SDK_DISABLED", "OTEL_TRACES_SAMPLER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"} {
				t.Setenv(k, tc.env[k])
				if tc.env[k] == "" {
					_ = os.Unsetenv(k)
				} else {
					environ = append(environ, k+"="+tc.env[k])
				}
			}
			stop, err := startTracing(context.Background(), "server", environ, log)
			var cfgErr *ConfigError
			if tc.bad {
				if !errors.As(err, &cfgErr) {
					t.Fatalf("err = %v, want a ConfigError", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer stop()
			_, isSDK := otel.GetTracerProvider().(*sdktrace.TracerProvider)
			if isSDK != tc.sdk {
				t.Fatalf("SDK installed: %t, want %t", isSDK, tc.sdk)
			}
			if !tc.sdk {
				return
			}
			// Not ended: nothing is printed.
			_, span := otel.Tracer("test").Start(context.Background(), "probe")
			if got := span.SpanContext().IsSampled(); got != tc.sampled {
				t.Errorf("sampled = %t, want %t", got, tc.sampled)
			}
		})
	}
}
