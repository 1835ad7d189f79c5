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
func (t *telemetry) lockLostSpan(h holder, cause error) {
	if !t.orphanSpans && !t.rootSpans {
		return
	}
	attrs := append([]attribute.KeyValue{t.system, AttrLockKind.String("advisory"), AttrLockScope.String("session"),
		AttrLockKeys.String(h.Key), AttrLockOutcome.String(outcomeLost)}, h.spanAttrs()...)
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...)}
	if h.span.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: h.span}))
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

// lockWait times one lock acquisition: a span (when one is wanted) and the
// wait histogram. Its zero value records nothing.
type lockWait struct {
	t     *telemetry
	span  trace.Span
	start time.Time
	kind  string
	mode  string
	scope string
	stop  chan struct{}  // stops the blockers lookup
	self  *selfWaitProbe // a row-lock wait that may be a self-wait (selfwait.go)
	// heldBy's holder, kept for a span started at the wait's end
	// (orphanSpans) when the wait had none.
	holders []holder
	waitInfo
}

// orphanWait is how long a wait outside a trace must last for lockhooks
// to record it as a trace of its own (see WithRootSpans).
const orphanWait = 100 * time.Millisecond

// startWait begins timing an acquisition of a lock of kind.
func (t *telemetry) startWait(ctx context.Context, kind, mode, scope string, attrs ...attribute.KeyValue) (context.Context, *lockWait) {
	w := &lockWait{t: t, start: time.Now(), kind: kind, mode: mode, scope: scope}
	if parent := trace.SpanFromContext(ctx); t.rootSpans || parent.IsRecording() {
		all := append([]attribute.KeyValue{t.system, AttrLockKind.String(kind), AttrLockMode.String(mode), AttrLockScope.String(scope)}, attrs...)
		ctx, w.span = t.tracer.Start(ctx, "lock.wait "+kind, trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(all...))
		if !w.span.IsRecording() {
			w.span = nil
		}
	}
	t.watch.add(ctx, w, attrs)
	return ctx, w
}

// recording reports whether the wait has a recording span.
func (w *lockWait) recording() bool { return w != nil && w.span != nil }

// wantsHolder reports whether the wait records its holder: it has a
// recording span, or may get one at its end (orphanSpans).
func (w *lockWait) wantsHolder() bool {
	return w.recording() || w != nil && w.span == nil && w.t.orphanSpans
}

// heldBy records what holds the lock this acquisition waits for, as the
// model of holders names it: a link to the holder's span, and its
// database, connection, backend pid, call site and since when.
func (w *lockWait) heldBy(h holder) {
	if w != nil && w.span == nil && w.t.orphanSpans {
		w.holders = append(w.holders, h) // for a span at the wait's end
		return
	}
	if !w.recording() {
		return
	}
	attrs := h.spanAttrs()
	if h.span.IsValid() {
		w.span.AddLink(trace.Link{SpanContext: h.span, Attributes: attrs})
	}
	w.span.SetAttributes(append(attrs, AttrHolderDescription.String(h.String()))...)
}

// end finishes the acquisition with an outcome; a zero outcome is derived
// from err.
func (w *lockWait) end(ctx context.Context, outcome string, err error) {
	if w == nil {
		return
	}
	if w.stop != nil {
		close(w.stop)
	}
	if outcome == "" {
		outcome = outcomeOf(err)
	}
	w.t.watch.remove(w, outcome)
	if h := w.t.wait; h != nil && h.Enabled(ctx) {
		h.Record(ctx, time.Since(w.start).Seconds(), w.t.base, metric.WithAttributes(
			AttrLockKind.String(w.kind), AttrLockMode.String(w.mode), AttrLockScope.String(w.scope), AttrLockOutcome.String(outcome)))
	}
	if w.span == nil && w.t.orphanSpans && time.Since(w.start) >= orphanWait && !trace.SpanContextFromContext(ctx).IsValid() {
		w.orphanSpan(ctx)
	}
	if w.span == nil {
		return
	}
	w.span.SetAttributes(AttrLockOutcome.String(outcome))
	switch outcome {
	case outcomeAcquired, outcomeNotAcquired:
	default:
		if code := statusCode(err); code != "" {
			w.span.SetAttributes(attrDBStatus.String(code))
		}
		w.span.SetAttributes(attrErrorType.String(errorType(outcome, err)))
		if outcome != outcomeCanceled && err != nil {
			w.span.RecordError(err)
			w.span.SetStatus(codes.Error, err.Error())
		}
	}
	w.span.End()
}

// orphanSpan starts, at the end of a wait outside any trace, the span it
// would have had as a root span, from the wait's start, with its holders
// (see WithRootSpans).
func (w *lockWait) orphanSpan(ctx context.Context) {
	attrs := []attribute.KeyValue{w.t.system, AttrLockKind.String(w.kind), AttrLockMode.String(w.mode), AttrLockScope.String(w.scope)}
	if w.namespace != "" {
		attrs = append(attrs, AttrLockNamespace.String(w.namespace))
	}
	if w.keys != "" {
		attrs = append(attrs, AttrLockKeys.String(w.keys))
	}
	if w.conn != nil {
		if pid := w.conn.pid.Load(); pid != 0 {
			attrs = append(attrs, AttrBackendPID.Int64(int64(pid)))
		}
	}
	holders := w.holders
	if len(holders) == 0 && w.t.watch != nil {
		// Named by the slow-wait log or the lookup: on Postgres, the
		// holders at the root of the chain the server showed.
		w.t.watch.mu.Lock()
		found := w.found
		w.t.watch.mu.Unlock()
		if found != nil {
			for _, h := range found.holders {
				if !h.Queued {
					holders = append(holders, h)
				}
			}
		}
	}
	if text := w.holderNamed(); text != "" && len(holders) == 0 {
		attrs = append(attrs, AttrHolderDescription.String(text)) // backends nobody identified
	}
	_, w.span = w.t.tracer.Start(ctx, "lock.wait "+w.kind, trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithTimestamp(w.start), trace.WithAttributes(attrs...))
	if !w.span.IsRecording() {
		w.span = nil
		return
	}
	for _, h := range holders {
		w.heldBy(h)
	}
}

// outcomeOf classifies the error of a lock acquisition.
func outcomeOf(err error) string {
	switch {
	case err == nil:
		return outcomeAcquired
	case errors.Is(err, ErrLockLost):
		return outcomeLost
	case errors.Is(err, context.Canceled):
		return outcomeCanceled
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, ErrWriterLockTimeout):
		return outcomeTimeout
	}
	switch dberr.SQLState(err) {
	case "40P01":
		return outcomeDeadlock
	case "55P03":
		return outcomeTimeout
	case "57014":
		return outcomeCanceled
	}
	return outcomeError
}

// statusCode returns the database's code for err: a SQLSTATE, or an SQLite
// result code.
func statusCode(err error) string {
	if s := dberr.SQLState(err); s != "" {
		return s
	}
	var lite interface{ Code() int }
	if errors.As(err, &lite) {
		return fmt.Sprint(lite.Code())
	}
	return ""
}

// errorType is error.type: the outcome for lock failures, else the Go type.
func errorType(outcome string, err error) string {
	if outcome != outcomeError || err == nil {
		return outcome
	}
	return fmt.Sprintf("%T", err)
}

// lookForBlockers asks, once the wait has lasted the threshold, who
// blocks the statement of wc (backend pid), on a side connection of its
// own, as the model of holders names them: an event lists the backends
// Postgres shows, and the holders it finds there (at the root of the
// chain) are the span's holders, with links to their spans. It never runs
// on the waiting connection.
func (w *lockWait) lookForBlockers(wc *conn, pid int32) {
	c := wc.connector
	if !w.recording() || w.t.blockerThreshold <= 0 || pid == 0 || c.opts.dialect != Postgres {
		return
	}
	w.stop = make(chan struct{})
	stop, span, threshold := w.stop, w.span, w.t.blockerThreshold
	v := waitView{w: w, kind: w.kind, conn: wc, advKeys: w.advKeys}
	go func() {
		timer := time.NewTimer(threshold)
		defer timer.Stop()
		select {
		case <-stop:
			return
		case <-timer.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), c.opts.lockCheckTimeout)
		defer cancel()
		found := c.holdersOf(ctx, v)
		if found.err != nil {
			span.AddEvent("lockhooks.lock.blockers", trace.WithAttributes(attribute.String("lockhooks.error", found.err.Error())))
			return
		}
		span.AddEvent("lockhooks.lock.blockers", trace.WithAttributes(found.eventAttrs(pid)...))
		for _, h := range found.holders {
			if h.Depth > 0 && !h.Queued { // the in-process holders were named when the wait began
				w.heldBy(h)
			}
		}
		if _, ok := found.root(); !ok {
			if x, ok := found.rootBlocker(); ok { // a backend nobody identified
				attrs := []attribute.KeyValue{AttrHolderPID.Int64(int64(x.PID)), AttrHolderDescription.String(x.String())}
				if x.XactSeconds >= 0 {
					attrs = append(attrs, AttrHolderHeldSeconds.Float64(x.XactSeconds))
				}
				span.SetAttributes(attrs...)
			}
		}
		w.noteFound(found)
	}()
}

// eventAttrs are the attributes of a wait span's lockhooks.lock.blockers
// event: the backends that block the wait (of waiter pid) directly, as
// Postgres shows them, the one at the root and those queued ahead.
func (b *blockage) eventAttrs(pid int32) []attribute.KeyValue {
	var pids, queued []int64
	var states, starts, queries, apps []string
	for _, x := range b.server {
		if x.Waiting {
			queued = append(queued, int64(x.PID))
		}
		if x.Depth > 1 {
			continue
		}
		start := ""
		if x.XactSeconds >= 0 {
			start = b.at.Add(-time.Duration(x.XactSeconds * float64(time.Second))).UTC().Format(time.RFC3339Nano)
		}
		pids, states, starts = append(pids, int64(x.PID)), append(states, x.State), append(starts, start)
		queries, apps = append(queries, truncate(x.Query, 200)), append(apps, x.ApplicationName)
	}
	attrs := []attribute.KeyValue{
		AttrBackendPID.Int64(int64(pid)),
		attribute.Int64Slice("lockhooks.blocker.backend_pids", pids),
		attribute.StringSlice("lockhooks.blocker.states", states),
		attribute.StringSlice("lockhooks.blocker.xact_starts", starts),
		attribute.StringSlice("lockhooks.blocker.queries", queries),
		attribute.StringSlice("lockhooks.blocker.application_names", apps),
	}
	if len(queued) > 0 {
		attrs = append(attrs, attribute.Int64Slice("lockhooks.blocker.queued_pids", queued))
	}
	if h, ok := b.root(); ok && h.PID != 0 {
		attrs = append(attrs, attribute.Int64("lockhooks.blocker.root_pid", int64(h.PID)))
	} else if x, ok := b.rootBlocker(); ok {
		attrs = append(attrs, attribute.Int64("lockhooks.blocker.root_pid", int64(x.PID)))
	}
	return attrs
}

// asString converts the text values drivers return.
func asString(v driver.Value) string {
	switch x := v.(type) {
	case string:
		return x
	case []byte:
		return string(x)
	case nil:
		return ""
	}
	return fmt.Sprint(v)
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

// startAdvisoryWait times a statement's advisory-lock acquisitions, naming
// the holder when another connection of this database holds a key. keys
// and known are the key of each call, where known (advisoryPlan's).
func (c *conn) startAdvisoryWait(ctx context.Context, adv *sqlscan.Advisory, keys []lockKey, known []bool, site string) *lockWait {
	var acquire *sqlscan.AdvisoryCall
	var names []string
	var resolved []lockKey
	for i, call := range adv.Calls {
		if call.Func&(sqlscan.FnUnlock|sqlscan.FnUnlockAll) != 0 {
			continue
		}
		if acquire == nil {
			acquire = &adv.Calls[i]
		}
		switch {
		case !known[i]:
			names = append(names, "expression")
		case len(adv.Calls) == 1:
			names, resolved = append(names, keys[0].String()), keys[:1:1] // (no allocation)
		default:
			names, resolved = append(names, keys[i].String()), append(resolved, keys[i])
		}
	}
	if acquire == nil {
		return nil
	}
	mode, scope := "exclusive", "session"
	if acquire.Func&sqlscan.FnShared != 0 {
		mode = "shared"
	}
	if acquire.Func&sqlscan.FnXact != 0 {
		scope = "transaction"
	}
	_, w := c.connector.tel.startWait(ctx, "advisory", mode, scope, AttrLockKeys.String(strings.Join(names, ", ")))
	w.setWaiter(c, site, nil, "", resolved)
	if !w.wantsHolder() {
		return w
	}
	for _, k := range resolved {
		if h := c.connector.pins.holderOf(k, c); h != nil {
			w.heldBy(h.asHolder([]lockKey{k}))
		}
	}
	c.watchBlockers(ctx, w)
	return w
}

// startRowLockWait times a Postgres statement with a row-locking clause.
func (c *conn) startRowLockWait(ctx context.Context, st statement) *lockWait {
	mode := "for_key_share"
	switch {
	case st.locks&sqlscan.ForUpdate != 0 && !st.rewrote:
		mode = "for_update"
	case st.locks&(sqlscan.ForUpdate|sqlscan.ForNoKeyUpdate) != 0:
		mode = "for_no_key_update"
	case st.locks&sqlscan.ForShare != 0:
		mode = "for_share"
	}
	_, w := c.connector.tel.startWait(ctx, "row", mode, "transaction",
		AttrLockNoWait.Bool(st.locks&sqlscan.NoWait != 0), AttrLockSkipLocked.Bool(st.locks&sqlscan.SkipLocked != 0))
	w.setWaiter(c, "", nil, st.text, nil)
	c.watchBlockers(ctx, w)
	c.watchSelfWait(ctx, w, st)
	return w
}

// watchBlockers starts the blockers lookup of a recorded Postgres wait.
func (c *conn) watchBlockers(ctx context.Context, w *lockWait) {
	if !w.recording() || c.connector.tel.blockerThreshold <= 0 {
		return
	}
	pid, err := c.backendPID(ctx)
	if err != nil {
		return
	}
	w.span.SetAttributes(AttrBackendPID.Int64(int64(pid)))
	w.lookForBlockers(c, pid)
}

// endLockWait ends the statement's lock wait and notes, in its
// transaction, when row and transaction-level locks were first taken.
func (c *conn) endLockWait(ctx context.Context, plan advisoryPlan, err error) {
	w := plan.wait
	if w == nil {
		return
	}
	outcome := outcomeOf(err)
	st := plan.st
	switch {
	case err != nil && st.rowLock && st.locks&sqlscan.NoWait != 0 && dberr.SQLState(err) == "55P03":
		outcome = outcomeNotAcquired // NOWAIT found the row locked
	case err == nil && st.advisory != nil && st.advisory.Simple && st.advisory.Calls[0].Func&sqlscan.FnTry != 0:
		call := st.advisory.Calls[0]
		if k, ok := keyOf(call, plan.args); ok && call.Func&sqlscan.FnXact == 0 && !c.holds(k) {
			outcome = outcomeNotAcquired
		}
	}
	if outcome == outcomeAcquired && c.tx.inner != nil {
		switch {
		case st.rowLock:
			c.tx.took(&c.tx.rowSince)
		case w.scope == "transaction":
			c.tx.took(&c.tx.xactSince)
		}
	}
	w.end(ctx, outcome, err)
}
