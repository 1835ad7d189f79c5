package main

import (
	"context"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/otlptranslator"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/lockhooks/lockhooks"
)

// telemetry collects lockhooks' lock-wait spans for the summary table and
// exports them where the flags say; lockhooks' metrics go to a Prometheus
// exporter that -serve serves at /metrics.
type telemetry struct {
	tp      *sdktrace.TracerProvider
	mp      *sdkmetric.MeterProvider
	metrics http.Handler // the Prometheus exposition of mp
	file    *os.File

	mu    sync.Mutex
	waits []wait
}

// wait is one traced lock wait.
type wait struct {
	kind, keys, outcome, holder string
	wait                        time.Duration
}

func newTelemetry(ctx context.Context, cfg config) (*telemetry, error) {
	t := &telemetry{}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithSpanProcessor(t)}
	if cfg.traceOut != "" {
		f, err := os.Create(cfg.traceOut)
		if err != nil {
			return nil, err
		}
		t.file = f
		exp, err := stdouttrace.New(stdouttrace.WithWriter(f))
		if err != nil {
			return nil, err
		}
		opts = append(opts, sdktrace.WithBatcher(exp))
	}
	if cfg.otlp != "" {
		exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpoint(cfg.otlp), otlptracehttp.WithInsecure())
		if err != nil {
			return nil, err
		}
		opts = append(opts, sdktrace.WithBatcher(exp))
	}
	t.tp = sdktrace.NewTracerProvider(opts...)

	// The demo's own MeterProvider, read by the OpenTelemetry Prometheus
	// exporter into a registry of its own. The translation strategy is
	// explicit: the dashboards in dashboards/ use its names
	// (lockhooks_lock_wait_duration_seconds_bucket, ..._total).
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg),
		otelprom.WithTranslationStrategy(otlptranslator.UnderscoreEscapingWithSuffixes))
	if err != nil {
		return nil, err
	}
	t.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp),
		sdkmetric.WithResource(resource.NewSchemaless(attribute.String("service.name", "lockdemo"))))
	t.metrics = promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	return t, nil
}

// options are the lockhooks options that send spans and metrics here. The
// demo has no request spans of its own, so lockhooks starts root spans.
func (t *telemetry) options() []lockhooks.Option {
	return []lockhooks.Option{lockhooks.WithTracerProvider(t.tp), lockhooks.WithMeterProvider(t.mp), lockhooks.WithRootSpans(true)}
}

// OnStart implements sdktrace.SpanProcessor.
func (t *telemetry) OnStart(context.Context, sdktrace.ReadWriteSpan) {}

// OnEnd keeps the lock waits.
func (t *telemetry) OnEnd(s sdktrace.ReadOnlySpan) {
	if !strings.HasPrefix(s.Name(), "lock.wait ") {
		return
	}
	w := wait{wait: s.EndTime().Sub(s.StartTime()), holder: "-"}
	for _, kv := range s.Attributes() {
		switch kv.Key {
		case lockhooks.AttrLockKind:
			w.kind = kv.Value.AsString()
		case lockhooks.AttrLockKeys:
			w.keys = kv.Value.AsString()
		case lockhooks.AttrLockOutcome:
			w.outcome = kv.Value.AsString()
		case lockhooks.AttrHolderSite:
			w.holder = kv.Value.AsString()
		}
	}
	t.mu.Lock()
	t.waits = append(t.waits, w)
	t.mu.Unlock()
}

// Shutdown implements sdktrace.SpanProcessor.
func (t *telemetry) Shutdown(context.Context) error { return nil }

// ForceFlush implements sdktrace.SpanProcessor.
func (t *telemetry) ForceFlush(context.Context) error { return nil }

// slowest returns the n longest waits.
func (t *telemetry) slowest(n int) []wait {
	t.mu.Lock()
	defer t.mu.Unlock()
	ws := append([]wait(nil), t.waits...)
	sort.Slice(ws, func(i, j int) bool { return ws[i].wait > ws[j].wait })
	return ws[:min(n, len(ws))]
}

// count returns how many waits were traced.
func (t *telemetry) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.waits)
}

// shutdown flushes the exporters.
func (t *telemetry) shutdown(ctx context.Context) {
	t.tp.Shutdown(ctx)
	t.mp.Shutdown(ctx)
	if t.file != nil {
		t.file.Close()
	}
}
