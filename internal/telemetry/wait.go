package telemetry

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/lockhooks/lockhooks/internal/dberr"
	"github.com/lockhooks/lockhooks/internal/holders"
)

// OrphanWait is how long a wait outside a trace must last to be recorded
// as a trace of its own (see Config.TracerProvider).
const OrphanWait = 100 * time.Millisecond

// Wait times one lock acquisition: a span (when one is wanted) and the
// wait histogram. A caller keeps it by value inside its own record of the
// wait, so timing a wait allocates nothing of its own, and keeps the [Set]
// it started the wait with beside it: the Set's methods that take a *Wait
// (StartWait, WantsHolder, HeldBy, Record, WantsOrphanSpan,
// StartOrphanSpan) are given the wait's own. Its zero value records
// nothing.
type Wait struct {
	span  trace.Span
	start time.Time
	kind  string
	mode  string
	scope string
	// HeldBy's holders, kept for a span started at the wait's end (orphan
	// spans) when the wait had none.
	holders []holders.Holder
}

// StartWait begins timing, in w, an acquisition of a lock of kind
// ("advisory", "row", "lockset", "sqlite_writer"), mode and scope
// ("session", "transaction"); attrs are further span attributes (the keys,
// the namespace). The span, if one is wanted, is a child of ctx's.
func (t *Set) StartWait(ctx context.Context, w *Wait, kind, mode, scope string, attrs ...attribute.KeyValue) context.Context {
	*w = Wait{start: time.Now(), kind: kind, mode: mode, scope: scope}
	if parent := trace.SpanFromContext(ctx); t.rootSpans || parent.IsRecording() {
		all := append([]attribute.KeyValue{t.system, AttrLockKind.String(kind), AttrLockMode.String(mode), AttrLockScope.String(scope)}, attrs...)
		ctx, w.span = t.tracer.Start(ctx, "lock.wait "+kind, trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(all...))
		if !w.span.IsRecording() {
			w.span = nil
		}
	}
	return ctx
}

// Kind, Mode and Scope are the lock's, as StartWait was given them.
func (w *Wait) Kind() string  { return w.kind }
func (w *Wait) Mode() string  { return w.mode }
func (w *Wait) Scope() string { return w.scope }

// Started is when the wait began.
func (w *Wait) Started() time.Time { return w.start }

// Span is the wait's recording span, or nil.
func (w *Wait) Span() trace.Span { return w.span }

// Recording reports whether the wait has a recording span.
func (w *Wait) Recording() bool { return w != nil && w.span != nil }

// WantsHolder reports whether wait w records its holder: it has a
// recording span, or may get one at its end (an orphan span).
func (t *Set) WantsHolder(w *Wait) bool {
	return w.Recording() || w != nil && w.span == nil && t.orphanSpans
}

// HeldBy records what holds the lock wait w waits for, as the model of
// holders names it: a link to the holder's span, and its database,
// connection, backend pid, call site and since when.
func (t *Set) HeldBy(w *Wait, h holders.Holder) {
	if w != nil && w.span == nil && t.orphanSpans {
		w.holders = append(w.holders, h) // for a span at the wait's end
		return
	}
	if !w.Recording() {
		return
	}
	attrs := HolderAttrs(h)
	if h.Span.IsValid() {
		w.span.AddLink(trace.Link{SpanContext: h.Span, Attributes: attrs})
	}
	w.span.SetAttributes(append(attrs, AttrHolderDescription.String(h.String()))...)
}

// Holders are the holders HeldBy kept for an orphan span.
func (w *Wait) Holders() []holders.Holder { return w.holders }

// Record records wait w's duration in the wait histogram, with its
// outcome: the first step of ending it.
func (t *Set) Record(ctx context.Context, w *Wait, outcome string) {
	if h := t.wait; h != nil && h.Enabled(ctx) {
		h.Record(ctx, time.Since(w.start).Seconds(), t.base, metric.WithAttributes(
			AttrLockKind.String(w.kind), AttrLockMode.String(w.mode), AttrLockScope.String(w.scope), AttrLockOutcome.String(outcome)))
	}
}

// WantsOrphanSpan reports whether wait w, now ending in ctx, gets the
// span it would have had as a root span: it had none, spans outside traces
// are wanted, it lasted long enough, and ctx is in no trace.
func (t *Set) WantsOrphanSpan(ctx context.Context, w *Wait) bool {
	return w.span == nil && t.orphanSpans && time.Since(w.start) >= OrphanWait &&
		!trace.SpanContextFromContext(ctx).IsValid()
}

// StartOrphanSpan starts, at the end of wait w outside any trace, the
// span it would have had as a root span, from the wait's start, with
// attrs (beyond the lock's kind, mode and scope) and its holders.
func (t *Set) StartOrphanSpan(ctx context.Context, w *Wait, attrs []attribute.KeyValue, holders []holders.Holder) {
	attrs = append([]attribute.KeyValue{t.system, AttrLockKind.String(w.kind), AttrLockMode.String(w.mode), AttrLockScope.String(w.scope)}, attrs...)
	_, w.span = t.tracer.Start(ctx, "lock.wait "+w.kind, trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithTimestamp(w.start), trace.WithAttributes(attrs...))
	if !w.span.IsRecording() {
		w.span = nil
		return
	}
	for _, h := range holders {
		t.HeldBy(w, h)
	}
}

// Finish ends the wait's span, if any, with its outcome and error: the
// last step of ending it.
func (w *Wait) Finish(outcome string, err error) {
	if w.span == nil {
		return
	}
	w.span.SetAttributes(AttrLockOutcome.String(outcome))
	switch outcome {
	case OutcomeAcquired, OutcomeNotAcquired:
	default:
		if code := StatusCode(err); code != "" {
			w.span.SetAttributes(attrDBStatus.String(code))
		}
		w.span.SetAttributes(attrErrorType.String(errorType(outcome, err)))
		if outcome != OutcomeCanceled && err != nil {
			w.span.RecordError(err)
			w.span.SetStatus(codes.Error, err.Error())
		}
	}
	w.span.End()
}

// Outcomes classifies the errors of lock acquisitions; Lost and Timeout
// are the caller's sentinels of a lost lock and of an in-process lock wait
// that timed out.
type Outcomes struct {
	Lost, Timeout error
}

// Of is the outcome of an acquisition that ended with err.
func (o Outcomes) Of(err error) string {
	switch {
	case err == nil:
		return OutcomeAcquired
	case errors.Is(err, o.Lost):
		return OutcomeLost
	case errors.Is(err, context.Canceled):
		return OutcomeCanceled
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, o.Timeout):
		return OutcomeTimeout
	}
	switch dberr.SQLState(err) {
	case "40P01":
		return OutcomeDeadlock
	case "55P03":
		return OutcomeTimeout
	case "57014":
		return OutcomeCanceled
	}
	return OutcomeError
}

// errorType is error.type: the outcome for lock failures, else the Go type.
func errorType(outcome string, err error) string {
	if outcome != OutcomeError || err == nil {
		return outcome
	}
	return fmt.Sprintf("%T", err)
}
