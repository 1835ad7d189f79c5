package waits

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/lockhooks/lockhooks/internal/callsite"
	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/telemetry"
)

// Lock is one lock acquisition in progress, from [Watch.Start] to
// [Lock.End]: its span and histogram (the telemetry.Wait in its Entry),
// its entry among the database's waits in progress, the lookup of its
// blockers once it has lasted the telemetry's blocker threshold
// ([Lock.LookForBlockers]), and the caller's probe beside it
// ([Lock.SetProbe]). One allocation per wait. A nil *Lock is no wait:
// its methods do nothing and report nothing.
type Lock[W Waiter, K any] struct {
	Entry[W, K]
	watch *Watch[W, K]
	stop  chan struct{} // stops the blockers lookup
	probe Probe         // the caller's, until it takes it back
}

// Probe is a check the caller runs beside a wait (lockhooks' self-wait
// probe of a Postgres row-lock wait), kept by the wait until the caller
// takes it back ([Lock.TakeProbe]).
type Probe interface {
	// Stop ends the check, reporting whether it acted.
	Stop() bool
}

// Start begins timing an acquisition of a lock of kind (mode, scope, and
// the span's attrs, from which the wait's keys and namespace are read),
// and lists it among the waits in progress. A nil Watch starts no wait.
func (ww *Watch[W, K]) Start(ctx context.Context, kind, mode, scope string, attrs ...attribute.KeyValue) (context.Context, *Lock[W, K]) {
	if ww == nil {
		return ctx, nil
	}
	w := &Lock[W, K]{watch: ww}
	ctx = ww.cfg.Telemetry.StartWait(ctx, &w.Wait, kind, mode, scope, attrs...)
	ww.Add(ctx, &w.Entry, attrs)
	return ctx, w
}

// Recording reports whether the wait has a recording span.
func (w *Lock[W, K]) Recording() bool { return w != nil && w.Wait.Recording() }

// WantsHolder reports whether the wait records its holder.
func (w *Lock[W, K]) WantsHolder() bool {
	return w != nil && w.watch.cfg.Telemetry.WantsHolder(&w.Wait)
}

// HeldBy records what holds the lock the wait waits for.
func (w *Lock[W, K]) HeldBy(h holders.Holder) {
	if w != nil {
		w.watch.cfg.Telemetry.HeldBy(&w.Wait, h)
	}
}

// SetWaiter records who waits (see [Watch.SetWaiter]).
func (w *Lock[W, K]) SetWaiter(waiter W, site string, pcs *callsite.Stack, query string, keys []K) {
	if w != nil {
		w.watch.SetWaiter(&w.Entry, waiter, site, pcs, query, keys)
	}
}

// NoteFound keeps found as who holds what the wait waits for, unless
// someone found them first.
func (w *Lock[W, K]) NoteFound(found *holders.Blockage) {
	if w != nil {
		w.watch.NoteFound(&w.Entry, found)
	}
}

// HolderNamed names the holder of what the wait waits for, as the
// slow-wait log, the span's blockers read or the lookup found it (with
// its ages now), or "".
func (w *Lock[W, K]) HolderNamed() string {
	if w == nil {
		return ""
	}
	return w.watch.HolderNamed(&w.Entry)
}

// NoteSelfHint records that the wait is likely a self-wait, for its
// slow-wait log line and its timeout error ("" leaves it alone).
func (w *Lock[W, K]) NoteSelfHint(hint string) {
	if w != nil && hint != "" {
		w.watch.SetSelfHint(&w.Entry, hint)
	}
}

// WithSelfHint adds the wait's self-wait hint, if any, to the error of a
// wait that timed out or was cancelled (not one of a certain self-wait,
// [Config.SelfWait]); it still wraps err.
func (w *Lock[W, K]) WithSelfHint(err error) error {
	if w == nil || err == nil || w.watch.cfg.SelfWait != nil && errors.Is(err, w.watch.cfg.SelfWait) {
		return err
	}
	if o := w.watch.cfg.Outcomes.Of(err); o != telemetry.OutcomeTimeout && o != telemetry.OutcomeCanceled {
		return err
	}
	hint := w.watch.SelfHint(&w.Entry)
	if hint == "" {
		return err
	}
	return fmt.Errorf("%w (%s)", err, hint)
}

// SetProbe gives the wait the caller's probe, which it keeps until the
// caller takes it back.
func (w *Lock[W, K]) SetProbe(p Probe) {
	if w != nil {
		w.probe = p
	}
}

// TakeProbe returns the wait's probe, if any, and forgets it.
func (w *Lock[W, K]) TakeProbe() Probe {
	if w == nil {
		return nil
	}
	p := w.probe
	w.probe = nil
	return p
}

// End finishes the acquisition with an outcome (zero: derived from err,
// by the Watch's [Config.Outcomes]): the wait leaves the list, its
// histogram records it, and a wait outside any trace gets the span it
// would have had as a root span, where the telemetry wants one.
func (w *Lock[W, K]) End(ctx context.Context, outcome string, err error) {
	if w == nil {
		return
	}
	if w.stop != nil {
		close(w.stop)
	}
	if outcome == "" {
		outcome = w.watch.cfg.Outcomes.Of(err)
	}
	tel := w.watch.cfg.Telemetry
	w.watch.Remove(&w.Entry, outcome)
	tel.Record(ctx, &w.Wait, outcome)
	if tel.WantsOrphanSpan(ctx, &w.Wait) {
		w.orphanSpan(ctx)
	}
	w.Finish(outcome, err)
}

// orphanSpan starts, at the end of a wait outside any trace, the span it
// would have had as a root span, from the wait's start, with its holders.
func (w *Lock[W, K]) orphanSpan(ctx context.Context) {
	var attrs []attribute.KeyValue
	if ns := w.Namespace(); ns != "" {
		attrs = append(attrs, telemetry.AttrLockNamespace.String(ns))
	}
	if keys := w.Keys(); keys != "" {
		attrs = append(attrs, telemetry.AttrLockKeys.String(keys))
	}
	var none W
	if wc := w.Waiter(); wc != none {
		if pid := wc.PID(); pid != 0 {
			attrs = append(attrs, telemetry.AttrBackendPID.Int64(int64(pid)))
		}
	}
	found := w.Holders()
	if len(found) == 0 {
		// Named by the slow-wait log or the lookup: on Postgres, the
		// holders at the root of the chain the server showed.
		if b := w.watch.Found(&w.Entry); b != nil {
			for _, h := range b.Holders {
				if !h.Queued {
					found = append(found, h)
				}
			}
		}
	}
	if text := w.HolderNamed(); text != "" && len(found) == 0 {
		attrs = append(attrs, telemetry.AttrHolderDescription.String(text)) // backends nobody identified
	}
	w.watch.cfg.Telemetry.StartOrphanSpan(ctx, &w.Wait, attrs, found)
}

// LookForBlockers asks, once the wait has lasted the telemetry's blocker
// threshold, who blocks the statement of backend pid ([Config.HoldersOf],
// within timeout, on a connection other than the waiting one): an event on
// the span lists the backends the server showed, and the holders found
// there (at the root of the chain) become the span's holders, with links
// to their spans. It does nothing for a wait without a recording span,
// with no threshold, or without a backend. The waiting goroutine calls it
// once its waiter is set; the lookup runs on a goroutine of its own,
// stopped by End.
func (w *Lock[W, K]) LookForBlockers(pid int32, timeout time.Duration) {
	if !w.Recording() || pid == 0 {
		return
	}
	threshold := w.watch.cfg.Telemetry.BlockerThreshold()
	if threshold <= 0 {
		return
	}
	w.stop = make(chan struct{})
	stop, span, holdersOf := w.stop, w.Span(), w.watch.cfg.HoldersOf
	v := View[W, K]{Entry: &w.Entry, Kind: w.Kind(), Waiter: w.waiter, AdvKeys: w.advKeys}
	go func() {
		timer := time.NewTimer(threshold)
		defer timer.Stop()
		select {
		case <-stop:
			return
		case <-timer.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		found := holdersOf(ctx, v)
		if found.Err != nil {
			span.AddEvent("lockhooks.lock.blockers", trace.WithAttributes(attribute.String("lockhooks.error", found.Err.Error())))
			return
		}
		rootPID, hasRoot := found.RootPID()
		span.AddEvent("lockhooks.lock.blockers", trace.WithAttributes(telemetry.BlockersEvent(pid, found.Server, found.At, rootPID, hasRoot)...))
		for _, h := range found.Holders {
			if h.Depth > 0 && !h.Queued { // the in-process holders were named when the wait began
				w.HeldBy(h)
			}
		}
		if _, ok := found.Root(); !ok {
			if x, ok := found.RootBlocker(); ok { // a backend nobody identified
				span.SetAttributes(telemetry.UnknownBlocker(x)...)
			}
		}
		w.NoteFound(found)
	}()
}
