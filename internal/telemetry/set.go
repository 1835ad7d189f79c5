package telemetry

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/lockhooks/lockhooks/internal/dberr"
	"github.com/lockhooks/lockhooks/internal/holders"
)

// waitBuckets are the histogram boundaries, in seconds: lock waits range
// from sub-millisecond to minutes.
var waitBuckets = []float64{0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}

// Config is what a [Set] is made of: the database's options and name.
type Config struct {
	// TracerProvider and MeterProvider are where spans and metrics go; nil
	// means otel's global providers. A TracerProvider given explicitly also
	// turns on the orphan spans of long waits outside a trace (see
	// [Wait.WantsOrphanSpan]) unless RootSpans is set.
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
	// RootSpans starts wait spans also where the context carries no
	// recording span; StatementSpans adds a client span per statement.
	RootSpans, StatementSpans bool
	// BlockerThreshold is after how long a recorded wait asks who blocks
	// it (0: never).
	BlockerThreshold time.Duration
	// System is db.system.name ("postgresql", "sqlite"); Pool is the
	// database's pool name, on every observation.
	System, Pool string
	// Observe, if set, is called at each collection for the gauges of held
	// session locks and parked connections.
	Observe func() (held, parked int64)
}

// Set is the tracer and instruments of one wrapped database.
type Set struct {
	tracer           trace.Tracer
	rootSpans        bool
	orphanSpans      bool // a TracerProvider was given: waits of OrphanWait or more outside a trace get a span of their own
	statementSpans   bool
	blockerThreshold time.Duration
	system           attribute.KeyValue

	wait, hold     metric.Float64Histogram
	rerouted, lost metric.Int64Counter
	refused        metric.Int64Counter
	deadlocks      metric.Int64Counter
	timeouts       metric.Int64Counter
	serialization  metric.Int64Counter
	reg            metric.Registration
	base           metric.MeasurementOption // db.system.name, db.client.connection.pool.name
}

// New creates the tracer and instruments. An instrument that cannot be
// created is reported to otel.Handle and left out: telemetry never breaks
// the database.
func New(cfg Config) *Set {
	tp, mp := cfg.TracerProvider, cfg.MeterProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	t := &Set{
		tracer:           tp.Tracer(InstrumentationName),
		rootSpans:        cfg.RootSpans,
		orphanSpans:      cfg.TracerProvider != nil && !cfg.RootSpans,
		statementSpans:   cfg.StatementSpans,
		blockerThreshold: cfg.BlockerThreshold,
		system:           AttrDBSystem.String(cfg.System),
	}
	// Every observation carries the database's pool name, so that several
	// databases on one MeterProvider have series (and gauges) of their own.
	t.base = metric.WithAttributeSet(attribute.NewSet(t.system, AttrPoolName.String(cfg.Pool)))
	m := mp.Meter(InstrumentationName)
	check := func(err error) {
		if err != nil {
			otel.Handle(err)
		}
	}
	var err error
	t.wait, err = m.Float64Histogram("lockhooks.lock.wait.duration", metric.WithUnit("s"),
		metric.WithDescription("How long lock acquisitions waited."), metric.WithExplicitBucketBoundaries(waitBuckets...))
	check(err)
	t.hold, err = m.Float64Histogram("lockhooks.lock.hold.duration", metric.WithUnit("s"),
		metric.WithDescription("How long locks were held, from acquisition to release."), metric.WithExplicitBucketBoundaries(waitBuckets...))
	check(err)
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		check(err)
		return c
	}
	t.rerouted = counter("lockhooks.advisory.unlocks_rerouted", "{unlock}", "Advisory unlocks run on the parked connection that held the lock instead of the connection they were sent on.")
	t.refused = counter("lockhooks.advisory.unlocks_refused", "{unlock}", "Advisory unlocks refused with ErrNotLockOwner: no connection of this database held the lock, or one in use did.")
	t.lost = counter("lockhooks.lock.lost", "{lock}", "Locks lost because the connection holding them died.")
	t.deadlocks = counter("lockhooks.lock.deadlocks", "{error}", "Statements that failed with deadlock_detected (40P01).")
	t.timeouts = counter("lockhooks.lock.timeouts", "{error}", "Statements that failed with lock_not_available (55P03): lock_timeout or NOWAIT.")
	t.serialization = counter("lockhooks.tx.serialization_failures", "{error}", "Statements that failed with serialization_failure (40001).")
	held, err1 := m.Int64ObservableGauge("lockhooks.advisory.held_locks", metric.WithUnit("{lock}"),
		metric.WithDescription("Session advisory locks held by connections of this database (active or parked)."))
	parked, err2 := m.Int64ObservableGauge("lockhooks.advisory.parked_connections", metric.WithUnit("{connection}"),
		metric.WithDescription("Connections withdrawn from the pool because they hold session advisory locks."))
	check(errors.Join(err1, err2))
	if observe := cfg.Observe; err1 == nil && err2 == nil && observe != nil {
		t.reg, err = m.RegisterCallback(func(_ context.Context, obs metric.Observer) error {
			h, p := observe()
			obs.ObserveInt64(held, h, t.base)
			obs.ObserveInt64(parked, p, t.base)
			return nil
		}, held, parked)
		check(err)
	}
	return t
}

// Close unregisters the gauges' callback.
func (t *Set) Close() {
	if t.reg != nil {
		t.reg.Unregister()
	}
}

// BlockerThreshold is after how long a recorded wait asks who blocks it
// (0: never).
func (t *Set) BlockerThreshold() time.Duration { return t.blockerThreshold }

// add adds n to counter c with attributes, if the counter is enabled.
func (t *Set) add(ctx context.Context, c metric.Int64Counter, n int64, attrs ...attribute.KeyValue) {
	if c == nil || n == 0 || !c.Enabled(ctx) {
		return
	}
	c.Add(ctx, n, t.base, metric.WithAttributes(attrs...))
}

// LockLost counts n lost session locks of a kind.
func (t *Set) LockLost(ctx context.Context, kind string, n int) {
	t.add(ctx, t.lost, int64(n), AttrLockKind.String(kind), AttrLockScope.String("session"))
}

// LockLostSpan records a lost lock as a span "lock.lost advisory" of its
// own, linked to the span the lock was taken in, with the holder's
// identity: when spans outside traces are wanted (an explicit
// TracerProvider, or RootSpans), since the loss happens on no request's
// behalf.
func (t *Set) LockLostSpan(h holders.Holder, cause error) {
	if !t.orphanSpans && !t.rootSpans {
		return
	}
	attrs := append([]attribute.KeyValue{t.system, AttrLockKind.String("advisory"), AttrLockScope.String("session"),
		AttrLockKeys.String(h.Key), AttrLockOutcome.String(OutcomeLost)}, HolderAttrs(h)...)
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...)}
	if h.Span.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: h.Span}))
	}
	_, span := t.tracer.Start(context.Background(), "lock.lost advisory", opts...)
	span.SetStatus(codes.Error, "lock lost: "+cause.Error())
	span.End()
}

// UnlockRerouted counts one rerouted unlock.
func (t *Set) UnlockRerouted(ctx context.Context) { t.add(ctx, t.rerouted, 1) }

// UnlockRefused counts one unlock refused with ErrNotLockOwner.
func (t *Set) UnlockRefused(ctx context.Context) { t.add(ctx, t.refused, 1) }

// CountError counts the lock-related failure of a statement (a deadlock,
// a lock timeout, a serialization failure) and returns err's SQLSTATE, so
// the caller can note it elsewhere too.
func (t *Set) CountError(ctx context.Context, err error) (sqlState string) {
	state := dberr.SQLState(err)
	switch state {
	case "40P01":
		t.add(ctx, t.deadlocks, 1)
	case "55P03":
		t.add(ctx, t.timeouts, 1)
	case "40001":
		t.add(ctx, t.serialization, 1)
	}
	return state
}

// RecordHold records how long a lock of kind was held.
func (t *Set) RecordHold(ctx context.Context, kind, scope string, since time.Time) {
	if t.hold == nil || since.IsZero() || !t.hold.Enabled(ctx) {
		return
	}
	t.hold.Record(ctx, time.Since(since).Seconds(), t.base,
		metric.WithAttributes(AttrLockKind.String(kind), AttrLockScope.String(scope)))
}

// StatementSpans reports whether statements get client spans.
func (t *Set) StatementSpans() bool { return t.statementSpans }

// WantsStatementSpan reports whether a statement run in ctx gets a client
// span: statement spans are on, and ctx is recorded or root spans are on.
func (t *Set) WantsStatementSpan(ctx context.Context) bool {
	return t.statementSpans && (t.rootSpans || trace.SpanFromContext(ctx).IsRecording())
}

// StatementSpan starts a client span for one statement, named name (a
// low-cardinality summary such as "SELECT users"), with the statement's
// text (never its arguments); nil where no span is wanted.
func (t *Set) StatementSpan(ctx context.Context, name, text string) (context.Context, trace.Span) {
	if !t.statementSpans {
		return ctx, nil
	}
	if parent := trace.SpanFromContext(ctx); !t.rootSpans && !parent.IsRecording() {
		return ctx, nil
	}
	ctx, span := t.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(t.system, attrDBQueryText.String(text)))
	return ctx, span
}

// EndStatementSpan ends a statement span (nil: none) with err; benign
// reports whether err is not the statement's failure (driver.ErrSkip:
// database/sql falls back to Prepare).
func EndStatementSpan(span trace.Span, err error, benign bool) {
	if span == nil {
		return
	}
	if err != nil && !benign {
		if code := StatusCode(err); code != "" {
			span.SetAttributes(attrDBStatus.String(code))
		}
		span.SetAttributes(attrErrorType.String(fmt.Sprintf("%T", err)))
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// StatusCode returns the database's code for err: a SQLSTATE, or an
// SQLite result code.
func StatusCode(err error) string {
	if s := dberr.SQLState(err); s != "" {
		return s
	}
	var lite interface{ Code() int }
	if errors.As(err, &lite) {
		return fmt.Sprint(lite.Code())
	}
	return ""
}
