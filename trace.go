package lockhooks

import (
	"context"
	"database/sql/driver"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/sqlscan"
	"github.com/lockhooks/lockhooks/internal/telemetry"
)

// Attribute keys: lockhooks' own namespace, and OpenTelemetry's database
// conventions. (internal/telemetry, which records them, has the same keys;
// TestAttributeKeys keeps the two equal.)
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
)

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

// reporting is what one wrapped database reports: its spans and metrics
// (internal/telemetry), its waits in progress (the debug page and the
// slow-wait log) and its recent events (the debug page).
type reporting struct {
	*telemetry.Set
	watch  *waitWatch
	events *holders.Events
}

// newReporting creates the database's tracer and instruments; observe is
// called at each collection for the gauges.
func newReporting(o *options, pool string, observe func() (held, parked int64)) *reporting {
	system := "postgresql"
	if o.dialect == SQLite {
		system = "sqlite"
	}
	return &reporting{Set: telemetry.New(telemetry.Config{
		TracerProvider: o.tracerProvider, MeterProvider: o.meterProvider,
		RootSpans: o.rootSpans, StatementSpans: o.statementSpans, BlockerThreshold: o.blockerThreshold,
		System: system, Pool: pool, Observe: observe,
	})}
}

// countError counts the lock-related failures of a statement, in the
// metrics and the page's counters (a deadlock's event, with the whole
// explanation, is conn.deadlockError's).
func (t *reporting) countError(ctx context.Context, err error) {
	switch t.CountError(ctx, err) {
	case "55P03":
		t.events.Count(countLockTimeout, 1)
	case "40001":
		t.events.Count(countSerialization, 1)
	}
}

// statementSpan starts a client span for one statement (WithStatementSpans),
// named by querySummary.
func (t *reporting) statementSpan(ctx context.Context, text string) (context.Context, trace.Span) {
	if !t.WantsStatementSpan(ctx) {
		return ctx, nil
	}
	return t.StatementSpan(ctx, querySummary(text), text)
}

// endStatementSpan ends a statement span with err; driver.ErrSkip is not
// the statement's failure (database/sql falls back to Prepare).
func endStatementSpan(span trace.Span, err error) {
	telemetry.EndStatementSpan(span, err, err == driver.ErrSkip)
}

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
