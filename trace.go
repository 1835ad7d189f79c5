package lockhooks

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/lockhooks/lockhooks/internal/dberr"
	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/sqlscan"
)

// instrumentationName names lockhooks' meter and tracer.
const instrumentationName = "github.com/lockhooks/lockhooks"

// Attribute keys: lockhooks' own namespace, and OpenTelemetry's database
// conventions.
const (
	AttrLockKind       = attribute.Key("lockhooks.lock.kind")        // advisory | row | lockset | sqlite_writer
	AttrLockMode       = attribute.Key("lockhooks.lock.mode")        // exclusive | shared | for_update | for_no_key_update | for_share | for_key_share
	AttrLockScope      = attribute.Key("lockhooks.lock.scope")       // session | transaction
	AttrLockNamespace  = attribute.Key("lockhooks.lock.namespace")   // Lock's namespace
	AttrLockKeys       = attribute.Key("lockhooks.lock.keys")        // the keys or ids, as text
	AttrLockOutcome    = attribute.Key("lockhooks.lock.outcome")     // acquired | not_acquired | timeout | deadlock | canceled | lost | error
	AttrLockNoWait     = attribute.Key("lockhooks.lock.nowait")      // a row lock with NOWAIT
	AttrLockSkipLocked = attribute.Key("lockhooks.lock.skip_locked") // a row lock with SKIP LOCKED
	AttrBackendPID     = attribute.Key("lockhooks.conn.backend_pid")
	AttrHolderSite     = attribute.Key("lockhooks.holder.call_site") // where the holder took the lock
	AttrHolderSince    = attribute.Key("lockhooks.holder.since")     // when the holder took it (RFC 3339)
	AttrHolderPID      = attribute.Key("lockhooks.holder.backend_pid")
	AttrHolderPool     = attribute.Key("lockhooks.holder.pool.name")  // the holder's database (its pool name)
	AttrHolderConn     = attribute.Key("lockhooks.holder.connection") // the holder's connection number in its database
	// AttrHolderProcess is the holder's process (host/pid:nonce), when it is
	// another process: as that process's lockhooks published it.
	AttrHolderProcess     = attribute.Key("lockhooks.holder.process")
	AttrHolderHeldSeconds = attribute.Key("lockhooks.holder.held_seconds") // how long it had held when the wait named it, as far as known
	AttrHolderDescription = attribute.Key("lockhooks.holder.description")  // the holder as the slow-wait line and the error name it
	attrPoolName          = attribute.Key("db.client.connection.pool.name")
	attrDBSystem          = attribute.Key("db.system.name")
	attrDBStatus          = attribute.Key("db.response.status_code")
	attrErrorType         = attribute.Key("error.type")
	attrDBQueryText       = attribute.Key("db.query.text")
)

// Outcomes of a lock acquisition.
const (
	outcomeAcquired    = "acquired"
	outcomeNotAcquired = "not_acquired"
	outcomeTimeout     = "timeout"
	outcomeDeadlock    = "deadlock"
	outcomeCanceled    = "canceled"
	outcomeLost        = "lost"
	outcomeError       = "error"
)

// waitBuckets are the histogram boundaries, in seconds: lock waits range
// from sub-millisecond to minutes.
var waitBuckets = []float64{0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}

// WithTracerProvider sets where lockhooks' spans go; the default is
// otel.GetTracerProvider().
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(o *options) { o.tracerProvider = tp }
}

// WithMeterProvider sets where lockhooks' metrics go; the default is
// otel.GetMeterProvider().
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(o *options) { o.meterProvider = mp }
}

// WithRootSpans makes lockhooks start lock-wait spans also when the
// context carries no recording span: a span for every lock acquisition,
// waited for or not. By default lockhooks adds spans to traces that are
// already being recorded and, when a TracerProvider was given with
// [WithTracerProvider], also records as a trace of its own every wait that
// lasted at least 100ms in a context without a trace (the span starts when
// the wait started): waits are rare and are what you want to see.
func WithRootSpans(on bool) Option {
	return func(o *options) { o.rootSpans = on }
}

// WithBlockerThreshold sets after how long a Postgres lock wait makes
// lockhooks ask, on a side connection, who blocks it (pg_blocking_pids and
// pg_stat_activity), recorded as a span event (default 500ms; 0 turns it
// off). Only waits in recorded spans are looked into.
func WithBlockerThreshold(d time.Duration) Option {
	return func(o *options) { o.blockerThreshold = d }
}

// WithStatementSpans adds a client span per statement, following
// OpenTelemetry's database conventions (span name "SELECT table",
// db.query.text without argument values), for users who want one
// instrumentation layer instead of two. Off by default.
func WithStatementSpans(on bool) Option {
	return func(o *options) { o.statementSpans = on }
}

// telemetry is the tracer and instruments of one wrapped database.
type telemetry struct {
	tracer           trace.Tracer
	rootSpans        bool
	orphanSpans      bool // a TracerProvider was given: waits of orphanWait or more outside a trace get a span of their own
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

	watch  *waitWatch // the waits in progress (debug page, slow-wait log)
	events *eventRing // recent events and counters (debug page)
}

// newTelemetry creates the tracer and instruments; observe is called at
// each collection for the gauges. An instrument that cannot be created is
// reported to otel.Handle and left out: telemetry never breaks the
// database.
func newTelemetry(o *options, pool string, observe func() (held, parked int64)) *telemetry {
	tp, mp := o.tracerProvider, o.meterProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	system := "postgresql"
	if o.dialect == SQLite {
		system = "sqlite"
	}
	t := &telemetry{
		tracer:           tp.Tracer(instrumentationName),
		rootSpans:        o.rootSpans,
		orphanSpans:      o.tracerProvider != nil && !o.rootSpans,
		statementSpans:   o.statementSpans,
		blockerThreshold: o.blockerThreshold,
		system:           attrDBSystem.String(system),
	}
	// Every observation carries the database's pool name, so that several
	// databases on one MeterProvider have series (and gauges) of their own.
	t.base = metric.WithAttributeSet(attribute.NewSet(t.system, attrPoolName.String(pool)))
	m := mp.Meter(instrumentationName)
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
	if err1 == nil && err2 == nil && observe != nil {
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

// close unregisters the gauges' callback.
func (t *telemetry) close() {
	if t.reg != nil {
		t.reg.Unregister()
	}
}

// add adds n to counter c with attributes, if the counter is enabled.
func (t *telemetry) add(ctx context.Context, c metric.Int64Counter, n int64, attrs ...attribute.KeyValue) {
	if c == nil || n == 0 || !c.Enabled(ctx) {
		return
	}
	c.Add(ctx, n, t.base, metric.WithAttributes(attrs...))
}

// lockLost counts lost locks of a kind.
func (t *telemetry) lockLost(ctx context.Context, kind string, n int) {
	t.add(ctx, t.lost, int64(n), AttrLockKind.String(kind), AttrLockScope.String("session"))
}

// lockLostSpan records a lost lock as a span "lock.lost advisory" of its
// own, linked to the span the lock was taken in, with the holder's
// identity: when spans outside traces are wanted (WithTracerProvider or
// WithRootSpans), since the loss happens on no request's behalf.
func (t *telemetry) lockLostSpan(h holders.Holder, cause error) {
	if !t.orphanSpans && !t.rootSpans {
		return
	}
	attrs := append([]attribute.KeyValue{t.system, AttrLockKind.String("advisory"), AttrLockScope.String("session"),
		AttrLockKeys.String(h.Key), AttrLockOutcome.String(outcomeLost)}, holderSpanAttrs(h)...)
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...)}
	if h.Span.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: h.Span}))
	}
	_, span := t.tracer.Start(context.Background(), "lock.lost advisory", opts...)
	span.SetStatus(codes.Error, "lock lost: "+cause.Error())
	span.End()
}

// unlockRerouted counts one rerouted unlock.
func (t *telemetry) unlockRerouted(ctx context.Context) { t.add(ctx, t.rerouted, 1) }

// unlockRefused counts one unlock refused with ErrNotLockOwner.
func (t *telemetry) unlockRefused(ctx context.Context) { t.add(ctx, t.refused, 1) }

// countError counts the lock-related failures of a statement.
func (t *telemetry) countError(ctx context.Context, err error) {
	switch dberr.SQLState(err) {
	case "40P01":
		t.add(ctx, t.deadlocks, 1) // its event, with the whole explanation: conn.deadlockError
	case "55P03":
		t.add(ctx, t.timeouts, 1)
		t.events.count(countLockTimeout, 1)
	case "40001":
		t.add(ctx, t.serialization, 1)
		t.events.count(countSerialization, 1)
	}
}

// recordHold records how long a lock of kind was held.
func (t *telemetry) recordHold(ctx context.Context, kind, scope string, since time.Time) {
	if t.hold == nil || since.IsZero() || !t.hold.Enabled(ctx) {
		return
	}
	t.hold.Record(ctx, time.Since(since).Seconds(), t.base,
		metric.WithAttributes(AttrLockKind.String(kind), AttrLockScope.String(scope)))
}

// statementSpan starts a client span for one statement (WithStatementSpans).
func (t *telemetry) statementSpan(ctx context.Context, text string) (context.Context, trace.Span) {
	if !t.statementSpans {
		return ctx, nil
	}
	if parent := trace.SpanFromContext(ctx); !t.rootSpans && !parent.IsRecording() {
		return ctx, nil
	}
	ctx, span := t.tracer.Start(ctx, querySummary(text), trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(t.system, attrDBQueryText.String(text)))
	return ctx, span
}

// endStatementSpan ends a statement span with err.
func endStatementSpan(span trace.Span, err error) {
	if span == nil {
		return
	}
	if err != nil && !isBenignStatementError(err) {
		if code := statusCode(err); code != "" {
			span.SetAttributes(attrDBStatus.String(code))
		}
		span.SetAttributes(attrErrorType.String(fmt.Sprintf("%T", err)))
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// isBenignStatementError reports errors that are not the statement's
// failure: driver.ErrSkip (database/sql falls back to Prepare).
func isBenignStatementError(err error) bool { return err == driver.ErrSkip }

// querySummary is a low-cardinality span name: the operation and the first
// table, e.g. "SELECT users".
func querySummary(text string) string {
	op := strings.ToUpper(sqlscan.FirstWord(text))
	if op == "" {
		return "query"
	}
	if table := sqlscan.FirstTable(text, sqlscan.Postgres); table != "" {
		return op + " " + table
	}
	return op
}
