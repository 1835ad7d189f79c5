package lockhooks

// Lock waits as spans: one span per wait for a lock (advisory, row, lockset,
// writer), its outcome and error type, the holders named on it once the
// wait passes the blocker threshold, and the orphan span of a wait whose
// context ended first.

import (
	"context"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/lockhooks/lockhooks/internal/dberr"
	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/sqlscan"
	"github.com/lockhooks/lockhooks/internal/telemetry"
	"github.com/lockhooks/lockhooks/internal/waits"
)

// lockWait is one lock acquisition in progress: its span and histogram
// (telemetry.Wait), the lookup of its blockers, its self-wait probe, and
// what the debug page and the slow-wait log know of it (waits.Entry). One
// allocation per wait.
type lockWait struct {
	waits.Entry[*conn, lockKey]
	t    *reporting
	stop chan struct{}  // stops the blockers lookup
	self *selfWaitProbe // a row-lock wait that may be a self-wait (selfwait.go)
}

// startWait begins timing an acquisition of a lock of kind, and lists it
// among the database's waits in progress.
func (t *reporting) startWait(ctx context.Context, kind, mode, scope string, attrs ...attribute.KeyValue) (context.Context, *lockWait) {
	w := &lockWait{t: t}
	ctx = t.StartWait(ctx, &w.Wait, kind, mode, scope, attrs...)
	t.watch.Add(ctx, &w.Entry, attrs)
	return ctx, w
}

// recording reports whether the wait (nil: none) has a recording span.
func (w *lockWait) recording() bool { return w != nil && w.Recording() }

// wantsHolder reports whether the wait (nil: none) records its holder.
func (w *lockWait) wantsHolder() bool { return w != nil && w.t.WantsHolder(&w.Wait) }

// heldBy records what holds the lock the wait (nil: none) waits for.
func (w *lockWait) heldBy(h holders.Holder) {
	if w != nil {
		w.t.HeldBy(&w.Wait, h)
	}
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
	w.t.watch.Remove(&w.Entry, outcome)
	w.t.Record(ctx, &w.Wait, outcome)
	if w.t.WantsOrphanSpan(ctx, &w.Wait) {
		w.orphanSpan(ctx)
	}
	w.Finish(outcome, err)
}

// orphanSpan starts, at the end of a wait outside any trace, the span it
// would have had as a root span, from the wait's start, with its holders
// (see WithRootSpans).
func (w *lockWait) orphanSpan(ctx context.Context) {
	var attrs []attribute.KeyValue
	if ns := w.Namespace(); ns != "" {
		attrs = append(attrs, AttrLockNamespace.String(ns))
	}
	if keys := w.Keys(); keys != "" {
		attrs = append(attrs, AttrLockKeys.String(keys))
	}
	if wc := w.Waiter(); wc != nil {
		if pid := wc.pin.PID.Load(); pid != 0 {
			attrs = append(attrs, AttrBackendPID.Int64(int64(pid)))
		}
	}
	holders := w.Holders()
	if len(holders) == 0 {
		// Named by the slow-wait log or the lookup: on Postgres, the
		// holders at the root of the chain the server showed.
		if found := w.t.watch.Found(&w.Entry); found != nil {
			for _, h := range found.Holders {
				if !h.Queued {
					holders = append(holders, h)
				}
			}
		}
	}
	if text := w.holderNamed(); text != "" && len(holders) == 0 {
		attrs = append(attrs, AttrHolderDescription.String(text)) // backends nobody identified
	}
	w.t.StartOrphanSpan(ctx, &w.Wait, attrs, holders)
}

// outcomeOf classifies the error of a lock acquisition.
func outcomeOf(err error) string {
	return telemetry.Outcomes{Lost: ErrLockLost, Timeout: ErrWriterLockTimeout}.Of(err)
}

// lookForBlockers asks, once the wait has lasted the threshold, who
// blocks the statement of wc (backend pid), on a side connection of its
// own, as the model of holders names them: an event lists the backends
// Postgres shows, and the holders it finds there (at the root of the
// chain) are the span's holders, with links to their spans. It never runs
// on the waiting connection.
func (w *lockWait) lookForBlockers(wc *conn, pid int32) {
	c := wc.connector
	if !w.recording() || w.t.BlockerThreshold() <= 0 || pid == 0 || c.opts.dialect != Postgres {
		return
	}
	w.stop = make(chan struct{})
	stop, span, threshold := w.stop, w.Span(), w.t.BlockerThreshold()
	v := waitView{Entry: &w.Entry, Kind: w.Kind(), Waiter: wc, AdvKeys: w.AdvisoryKeys()}
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
		if found.Err != nil {
			span.AddEvent("lockhooks.lock.blockers", trace.WithAttributes(attribute.String("lockhooks.error", found.Err.Error())))
			return
		}
		rootPID, hasRoot := found.RootPID()
		span.AddEvent("lockhooks.lock.blockers", trace.WithAttributes(telemetry.BlockersEvent(pid, found.Server, found.At, rootPID, hasRoot)...))
		for _, h := range found.Holders {
			if h.Depth > 0 && !h.Queued { // the in-process holders were named when the wait began
				w.heldBy(h)
			}
		}
		if _, ok := found.Root(); !ok {
			if x, ok := found.RootBlocker(); ok { // a backend nobody identified
				span.SetAttributes(telemetry.UnknownBlocker(x)...)
			}
		}
		w.noteFound(found)
	}()
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
		if h, ok := c.connector.pins.HolderOf(k, c); ok {
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
	if !w.recording() || c.connector.tel.BlockerThreshold() <= 0 {
		return
	}
	pid, err := c.BackendPID(ctx)
	if err != nil {
		return
	}
	w.Span().SetAttributes(AttrBackendPID.Int64(int64(pid)))
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
		outcome = telemetry.OutcomeNotAcquired // NOWAIT found the row locked
	case err == nil && st.advisory != nil && st.advisory.Simple && st.advisory.Calls[0].Func&sqlscan.FnTry != 0:
		call := st.advisory.Calls[0]
		if k, ok := keyOf(call, plan.args); ok && call.Func&sqlscan.FnXact == 0 && !c.holds(k) {
			outcome = telemetry.OutcomeNotAcquired
		}
	}
	if outcome == telemetry.OutcomeAcquired && c.tx.inner != nil {
		switch {
		case st.rowLock:
			c.tx.took(&c.tx.rowSince)
		case w.Scope() == "transaction":
			c.tx.took(&c.tx.xactSince)
		}
	}
	w.end(ctx, outcome, err)
}
