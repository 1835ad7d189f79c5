package pgstmt

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/lockhooks/lockhooks/internal/dberr"
	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/holding"
	"github.com/lockhooks/lockhooks/internal/inprocess"
	"github.com/lockhooks/lockhooks/internal/pgsession"
	"github.com/lockhooks/lockhooks/internal/sqlscan"
	"github.com/lockhooks/lockhooks/internal/stmtlocks"
	"github.com/lockhooks/lockhooks/internal/telemetry"
	"github.com/lockhooks/lockhooks/internal/waits"
)

// A statement's lock wait (waits.Lock: its span and histogram, the lookup
// of its blockers, its self-wait probe, what the debug page and the
// slow-wait log know of it): started from what the scanner found in the
// statement, with the holders this process knows of named at once, and
// ended with its outcome.

// startAdvisoryWait times a statement's advisory-lock acquisitions,
// naming the holder when another connection of this database holds a
// key. keys and known are the key of each call, where known (Plan's).
func (db *Database[C, K]) startAdvisoryWait(ctx context.Context, c C, adv *sqlscan.Advisory, keys []K, known []bool, site string) *waits.Lock[C, K] {
	mode, scope, text, resolved, ok := stmtlocks.AdvisoryWait(adv, keys, known)
	if !ok {
		return nil
	}
	_, w := db.Waits.Start(ctx, "advisory", mode, scope, telemetry.AttrLockKeys.String(text))
	w.SetWaiter(c, site, nil, "", resolved)
	if !w.WantsHolder() {
		return w
	}
	for _, k := range resolved {
		if h, ok := db.Sessions.HolderOf(k, c); ok {
			w.HeldBy(holding.Of(h, []K{k}))
		}
	}
	db.WatchBlockers(ctx, c, w)
	return w
}

// startRowLockWait times a Postgres statement of c with a row-locking
// clause.
func (db *Database[C, K]) startRowLockWait(ctx context.Context, c C, st Statement) *waits.Lock[C, K] {
	_, w := db.Waits.Start(ctx, "row", stmtlocks.RowLockMode(st.Locks, st.Rewrote), "transaction",
		telemetry.AttrLockNoWait.Bool(st.Locks&sqlscan.NoWait != 0), telemetry.AttrLockSkipLocked.Bool(st.Locks&sqlscan.SkipLocked != 0))
	w.SetWaiter(c, "", nil, st.Text, nil)
	db.WatchBlockers(ctx, c, w)
	db.watchSelfWait(ctx, c, w, st)
	return w
}

// WatchBlockers starts the blockers lookup of a recorded Postgres wait w
// of c, once the wait's waiter is set: who blocks c's statement, read on a side
// connection of its own, never on c (waits.Lock.LookForBlockers, which
// asks c's database, lockdb.DB.HoldersOf).
func (db *Database[C, K]) WatchBlockers(ctx context.Context, c C, w *waits.Lock[C, K]) {
	if !w.Recording() || db.Telemetry.BlockerThreshold() <= 0 {
		return
	}
	pid, err := c.BackendPID(ctx)
	if err != nil {
		return
	}
	w.Span().SetAttributes(telemetry.AttrBackendPID.Int64(int64(pid)))
	if db.Sessions != nil {
		w.LookForBlockers(pid, db.Sessions.Settings().CheckTimeout)
	}
}

// endLockWait ends the statement's lock wait and notes, in c's
// transaction, when row and transaction-level locks were first taken.
func (db *Database[C, K]) endLockWait(ctx context.Context, c C, plan *Plan[C, K], err error) {
	w := plan.Wait
	if w == nil {
		return
	}
	outcome := db.Outcomes.Of(err)
	st := plan.St
	switch {
	case err != nil && st.RowLock && st.Locks&sqlscan.NoWait != 0 && dberr.SQLState(err) == "55P03":
		outcome = telemetry.OutcomeNotAcquired // NOWAIT found the row locked
	case err == nil && st.Advisory != nil && st.Advisory.Simple && st.Advisory.Calls[0].Func&sqlscan.FnTry != 0:
		call := st.Advisory.Calls[0]
		if k, ok := stmtlocks.KeyOf(call, plan.Args); ok && call.Func&sqlscan.FnXact == 0 && !c.Pin().Holds(K(k)) {
			outcome = telemetry.OutcomeNotAcquired
		}
	}
	if outcome == telemetry.OutcomeAcquired {
		switch {
		case st.RowLock:
			c.TookInTx(true)
		case w.Scope() == "transaction":
			c.TookInTx(false)
		}
	}
	w.End(ctx, outcome, err)
}

// NameHolder adds to the error of c's lock wait w that timed out or was
// cancelled (the context, lock_timeout, statement_timeout) what it
// waited for, how long, and who holds it: as the slow-wait log, the wait
// span's blockers read or the lookup before the context's deadline found
// it (whichever came first, with its ages now), or, for Postgres advisory
// keys, as pg_locks shows it now. It still wraps err.
func (db *Database[C, K]) NameHolder(c C, w *waits.Lock[C, K], err error) error {
	if w == nil || err == nil || errors.Is(err, inprocess.ErrSelfWait) || errors.Is(err, pgsession.ErrLockLost) {
		return err
	}
	if o := db.Outcomes.Of(err); o != telemetry.OutcomeTimeout && o != telemetry.OutcomeCanceled {
		return err
	}
	waited := time.Since(w.Started()).Round(time.Millisecond)
	text := w.HolderNamed()
	if text == "" && len(w.AdvisoryKeys()) > 0 && db.Sessions != nil {
		// Nobody looked in time; the keys' holders, as pg_locks shows them
		// now (the server forgot the wait).
		ctx, cancel := context.WithTimeout(context.Background(), waits.LookupTimeout)
		b := &holders.Blockage{At: time.Now()}
		db.AddBlockers(b, db.KeyHolders(ctx, c, w.AdvisoryKeys()), w.AdvisoryKeys())
		cancel()
		if !b.Empty() {
			text = b.String()
		}
	}
	what := w.Kind() + " lock"
	switch {
	case w.Namespace() != "":
		what += fmt.Sprintf(" %q ids %s", w.Namespace(), w.Keys())
	case w.Keys() != "":
		what += " " + w.Keys()
	case w.Query() != "":
		what += fmt.Sprintf(" for %.120q", w.Query())
	}
	if text == "" {
		return fmt.Errorf("lockhooks: gave up waiting for the %s after %v (the holder was not looked up in time): %w", what, waited, err)
	}
	return fmt.Errorf("lockhooks: gave up waiting for the %s after %v; held by %s: %w", what, waited, text, err)
}
