package lockhooks

// Lock waits as spans: one span per wait for a lock (advisory, row, lockset,
// writer), its outcome and error type, the holders named on it once the
// wait passes the blocker threshold, and the orphan span of a wait whose
// context ended first.

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/lockhooks/lockhooks/internal/dberr"
	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/sqlscan"
)

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
	holders []holders.Holder
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
func (w *lockWait) heldBy(h holders.Holder) {
	if w != nil && w.span == nil && w.t.orphanSpans {
		w.holders = append(w.holders, h) // for a span at the wait's end
		return
	}
	if !w.recording() {
		return
	}
	attrs := holderSpanAttrs(h)
	if h.Span.IsValid() {
		w.span.AddLink(trace.Link{SpanContext: h.Span, Attributes: attrs})
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
		queries, apps = append(queries, holders.Truncate(x.Query, 200)), append(apps, x.ApplicationName)
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
