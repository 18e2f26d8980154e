package di

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/caarlos0/env/v11"
	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/contrib/propagators/autoprop"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/infra/provider/profiles"
)

// userAgent names the app at the token endpoint: which process refreshed.
type userAgent struct {
	base  http.RoundTripper
	value string
}

func (u userAgent) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context()) // a RoundTripper must not change the caller's request
	r.Header.Set("User-Agent", u.value)
	return u.base.RoundTrip(r)
}

// agentClient is a token endpoint client with app's User-Agent, if any.
func agentClient(timeout time.Duration, app string) *http.Client {
	c := provider.NewHTTPClient(timeout)
	if app != "" {
		c.Transport = userAgent{base: c.Transport, value: UserAgent(app)}
	}
	return c
}

// serveMetrics serves m at GET /metrics on addr until stop; a taken address fails the start.
func serveMetrics(addr string, m http.Handler, log *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on METRICS_ADDR: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", m)
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		WriteTimeout:      30 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	var done sync.WaitGroup
	done.Go(func() {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			log.Warn("metrics server stopped", "err", err)
		}
	})
	log.Info("metrics listening", "addr", ln.Addr().String())
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if srv.Shutdown(ctx) != nil {
			_ = srv.Close()
		}
		done.Wait()
	}, nil
}

// startTracing installs OpenTelemetry for app from the OTEL_* variables: the propagator always, an exporter only
// when asked for (a process without a collector must not log failures). stop flushes the spans.
func startTracing(ctx context.Context, app string, environ []string, log *slog.Logger) (stop func(), err error) {
	otel.SetTextMapPropagator(autoprop.NewTextMapPropagator())
	vars := env.ToMap(environ)
	asked := vars["OTEL_TRACES_EXPORTER"] != "" || vars["OTEL_EXPORTER_OTLP_ENDPOINT"] != "" || vars["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] != ""
	if !asked || strings.EqualFold(strings.TrimSpace(vars["OTEL_SDK_DISABLED"]), "true") {
		return func() {}, nil
	}
	exp, err := autoexport.NewSpanExporter(ctx)
	if err != nil {
		return nil, configErr("OTEL_TRACES_EXPORTER, OTEL_EXPORTER_OTLP_*: %v", err)
	}
	if autoexport.IsNoneSpanExporter(exp) {
		return func() {}, nil
	}
	res, err := resource.New(ctx,
		// Defaults: OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win.
		resource.WithAttributes(attribute.String("service.name", "tokenguard-"+app), attribute.String("service.version", AppVersion())),
		resource.WithFromEnv(), resource.WithTelemetrySDK(), resource.WithProcessPID())
	if err != nil {
		_ = exp.Shutdown(ctx)
		return nil, configErr("OTEL_RESOURCE_ATTRIBUTES: %v", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("OpenTelemetry: spans not exported", "err", err)
	}))
	log.Info("traces exported", "exporter", cmp.Or(vars["OTEL_TRACES_EXPORTER"], "otlp"))
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := tp.Shutdown(ctx); err != nil {
			log.Warn("OpenTelemetry: spans in flight not exported at shutdown", "err", err)
		}
	}, nil
}

// checkEndpoint asks the token endpoint about the client, authenticated as the token layer does it.
func checkEndpoint(ctx context.Context, cfg Config, client *http.Client) provider.CheckResult {
	prof, _ := profiles.Get(cfg.OAuth.Profile)
	opts := provider.ClientOptions(cfg.OAuth.Resource, cfg.OAuth.key, prof, provider.NewDiscovery(client))
	return provider.Check(ctx, OAuth2Config(cfg.OAuth), client, opts...)
}

// checkAtStart logs the token endpoint check's verdict, and keeps its answer as evidence.
func checkAtStart(ctx context.Context, cfg Config, app string, evidence provider.EvidenceStore, log *slog.Logger) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var done sync.WaitGroup
	done.Go(func() {
		res := checkEndpoint(ctx, cfg, agentClient(cfg.RefreshTimeout, app))
		if ctx.Err() != nil {
			return // stopped before the endpoint answered: nothing to tell
		}
		if err := provider.RecordCheck(ctx, evidence, OAuth2Config(cfg.OAuth), res); err != nil {
			log.Warn("token endpoint check: its answer could not be kept; ambiguous refusals stay unclassified", "err", err)
		}
		level := slog.LevelError
		switch res.Verdict {
		case provider.CheckOK:
			level = slog.LevelInfo
		case provider.CheckInconclusive:
			level = slog.LevelWarn
		}
		log.Log(context.Background(), level, "token endpoint check: "+res.String(),
			"verdict", res.Verdict.String(), "auth_style", res.Style())
	})
	return func() { cancel(); done.Wait() }
}
