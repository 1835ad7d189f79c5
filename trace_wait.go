package lockhooks

// Lock waits as spans, the root's part: the waits of a Postgres statement's
// advisory calls and row-locking clause, started from what the scanner
// found in it, with the holders this process knows of named at once, and
// their end. A wait from start to end (its span, its outcome, the holders
// named once it passes the blocker threshold, the orphan span of a wait
// whose context ended first) is a waits.Lock.

import (
	"context"

	"github.com/lockhooks/lockhooks/internal/dberr"
	"github.com/lockhooks/lockhooks/internal/holding"
	"github.com/lockhooks/lockhooks/internal/sqlscan"
	"github.com/lockhooks/lockhooks/internal/stmtlocks"
	"github.com/lockhooks/lockhooks/internal/telemetry"
	"github.com/lockhooks/lockhooks/internal/waits"
)

// lockWait is one lock acquisition in progress (waits.Lock): its span and
// histogram, the lookup of its blockers, its self-wait probe, and what the
// debug page and the slow-wait log know of it. One allocation per wait.
type lockWait = waits.Lock[*conn, lockKey]

// outcomeOf classifies the error of a lock acquisition.
func outcomeOf(err error) string { return outcomes().Of(err) }

// outcomes classifies the errors of lock acquisitions: lockhooks' own
// sentinels of a lost lock and of a writer-lock timeout among them.
func outcomes() telemetry.Outcomes {
	return telemetry.Outcomes{Lost: ErrLockLost, Timeout: ErrWriterLockTimeout}
}

// startAdvisoryWait times a statement's advisory-lock acquisitions, naming
// the holder when another connection of this database holds a key. keys
// and known are the key of each call, where known (advisoryPlan's).
func (c *conn) startAdvisoryWait(ctx context.Context, adv *sqlscan.Advisory, keys []lockKey, known []bool, site string) *lockWait {
	mode, scope, text, resolved, ok := stmtlocks.AdvisoryWait(adv, keys, known)
	if !ok {
		return nil
	}
	_, w := c.connector.Waits.Start(ctx, "advisory", mode, scope, AttrLockKeys.String(text))
	w.SetWaiter(c, site, nil, "", resolved)
	if !w.WantsHolder() {
		return w
	}
	for _, k := range resolved {
		if h, ok := c.connector.pins.HolderOf(k, c); ok {
			w.HeldBy(holding.Of(h, []lockKey{k}))
		}
	}
	c.watchBlockers(ctx, w)
	return w
}

// startRowLockWait times a Postgres statement with a row-locking clause.
func (c *conn) startRowLockWait(ctx context.Context, st statement) *lockWait {
	_, w := c.connector.Waits.Start(ctx, "row", stmtlocks.RowLockMode(st.locks, st.rewrote), "transaction",
		AttrLockNoWait.Bool(st.locks&sqlscan.NoWait != 0), AttrLockSkipLocked.Bool(st.locks&sqlscan.SkipLocked != 0))
	w.SetWaiter(c, "", nil, st.text, nil)
	c.watchBlockers(ctx, w)
	c.watchSelfWait(ctx, w, st)
	return w
}

// watchBlockers starts the blockers lookup of a recorded Postgres wait of
// c, once the wait's waiter is set: who blocks c's statement, read on a
// side connection of its own, never on c (waits.Lock.LookForBlockers,
// which asks c's database, lockdb.DB.HoldersOf).
func (c *conn) watchBlockers(ctx context.Context, w *lockWait) {
	if !w.Recording() || c.connector.tel.BlockerThreshold() <= 0 {
		return
	}
	pid, err := c.BackendPID(ctx)
	if err != nil {
		return
	}
	w.Span().SetAttributes(AttrBackendPID.Int64(int64(pid)))
	if c.connector.opts.dialect == Postgres {
		w.LookForBlockers(pid, c.connector.opts.lockCheckTimeout)
	}
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
	w.End(ctx, outcome, err)
}
