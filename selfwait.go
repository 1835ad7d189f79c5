package lockhooks

import (
	"context"
	"fmt"
	"time"

	"github.com/lockhooks/lockhooks/internal/callsite"
	"github.com/lockhooks/lockhooks/internal/dberr"
	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/holding"
	"github.com/lockhooks/lockhooks/internal/inprocess"
	"github.com/lockhooks/lockhooks/internal/pgblocking"
	"github.com/lockhooks/lockhooks/internal/sqlscan"
)

// Self-waits: a statement that would wait for a lock held by a transaction
// of its own call chain. The usual mistake is a statement run on the
// *sql.DB inside RunInTx's fn, instead of on the transaction:
//
//	lockhooks.RunInTx(ctx, db, nil, func(tx *sql.Tx) error {
//		tx.ExecContext(ctx, "UPDATE jobs …")   // takes the SQLite writer lock
//		db.ExecContext(ctx, "UPDATE jobs …")   // waits for tx, which waits for it
//	})
//
// Such a wait can end only by its timeout. lockhooks fails it at once, with
// an error wrapping ErrSelfWait that RunInTx does not retry, only when the
// holder is provably on the waiter's own stack: a transaction of a RunInTx
// attempt whose fn is running on the waiting goroutine. On Postgres the
// same holds for row locks (SELECT … FOR UPDATE/SHARE through the *sql.DB:
// the server is asked whether the statement waits for that transaction,
// and the statement cancelled if so, where both connections reach the
// server itself and no pooler is declared or seen; through a pooler the
// wait is only likely a self-wait),
// advisory locks and Lock; an UPDATE or DELETE that waits for a row is not
// probed, and waits until a timeout ends it. Any other wait that looks like
// one (the holder began, or took its lock, on this goroutine with this
// context, but might have been handed to another goroutine) waits as
// before, and its timeout error and slow-wait log line say it is likely a
// self-wait.

// ErrSelfWait is wrapped by the error of a statement (or BeginTx, Lock,
// AcquireAdvisoryLock) that would wait for a lock held by the transaction
// of a RunInTx attempt whose fn is running on the very goroutine that
// waits: fn is blocked in the wait, so the transaction cannot end before
// the wait's timeout. It fires for SQLite's writer lock, Lock's ids,
// Postgres advisory locks and Postgres row-locking SELECTs (FOR UPDATE,
// FOR SHARE …; where both connections reach the server itself and no
// pooler is declared or seen) run on the *sql.DB instead of the
// transaction, with any context, and RunInTx does not retry it. Run the
// statement through the transaction (tx.ExecContext, not
// db.ExecContext). A transaction begun
// with db.BeginTx, an AdvisoryLock, or a holder of another database (or
// *sql.DB) is never taken for a self-wait: it may be handed to another
// goroutine that ends it, so the wait goes on, and its timeout error and
// slow-wait log line say when it is likely one. (On architectures other
// than amd64 and arm64, where lockhooks cannot tell goroutines apart
// cheaply, every wait waits.)
var ErrSelfWait = inprocess.ErrSelfWait

// runOf returns the fn of RunInTx whose BeginTx context ctx is, or nil.
func runOf(ctx context.Context) *callsite.Run {
	if rc, ok := ctx.(*runInTxContext); ok {
		return rc.run
	}
	return nil
}

// chainOf is the current goroutine's call chain, with ctx, for a hold of
// run's transaction (run may be nil). RunInTx's BeginTx context counts as
// the caller's, which fn's statements run with.
func chainOf(ctx context.Context, run *callsite.Run) callsite.Chain {
	if rc, ok := ctx.(*runInTxContext); ok {
		ctx = rc.Context
	}
	return callsite.ChainOf(ctx, run)
}

// selfWaitHolder returns the connection of c's database (the same
// connector: advisory locks and rows belong to one database) other than c
// whose open transaction ctx's call chain holds: certain when it is
// RunInTx's with fn running on this goroutine, else one this goroutine
// began with ctx (likely), or nil. It looks at every open connection of
// the database, so it is called only on the way to a wait that may be one.
func selfWaitHolder(ctx context.Context, c *conn) (h *conn, certain bool) {
	h, _, certain = c.connector.SelfWait(ctx, c)
	return h, certain
}

// selfWaitAdvisory fails a blocking request for Postgres advisory keys
// that a transaction of the caller's own call chain holds, for certain
// (see selfWaitHolder), on another connection of the same database: Lock
// (names gives its keys' lockset ids), or a pg_advisory_lock /
// pg_advisory_xact_lock statement. For a likely self-wait it returns the
// hint for the wait (waits.Lock.NoteSelfHint). waiter describes the
// request, for the error only (formatting it on every request would cost
// allocations).
func (c *conn) selfWaitAdvisory(ctx context.Context, waiter func() string, keys []lockKey, names map[int64]string) (hint string, err error) {
	if len(keys) == 0 {
		return "", nil
	}
	h, certain := selfWaitHolder(ctx, c)
	if h == nil {
		return "", nil
	}
	held, found := holding.HeldAmong(h, keys)
	if !found {
		return "", nil
	}
	if !certain {
		return inprocess.HintTx, nil
	}
	what := "advisory key " + held.String()
	if name := names[held.K1]; name != "" {
		what = "lockset id " + name + " (" + what + ")"
	}
	return "", inprocess.SelfWaitError(waiter(), what, holding.Of(h, []lockKey{held}))
}

// watchSelfWait starts, for a Postgres row-lock wait of c (statement st)
// while a transaction of the same call chain is open on another
// connection of the database, the probe that fails it with ErrSelfWait if
// that transaction is certainly its own (see selfWaitHolder), or notes the
// hint of a likely self-wait. NOWAIT and SKIP LOCKED never wait.
//
// The probe cancels a backend, so it runs only where both backends are
// provably the connections' own: each reached the server itself and no
// pooler is declared or seen (the rule of internal/pgsession for ending a
// backend, endable). Through a pooler the backend a connection met at
// connect may serve another client, whose statement the probe would
// cancel; there the wait is only noted as likely a self-wait.
func (c *conn) watchSelfWait(ctx context.Context, w *lockWait, st statement) {
	if st.locks&(sqlscan.NoWait|sqlscan.SkipLocked) != 0 {
		return
	}
	h, certain := selfWaitHolder(ctx, c)
	switch {
	case h == nil:
	case certain && c.endable() && h.endable():
		probeSelfWait(w, c, h)
	default:
		w.NoteSelfHint(inprocess.HintTx)
	}
}

// selfWaitProbeDelay is how long a Postgres row-lock wait that may be a
// self-wait runs before lockhooks asks the server whose lock it waits for.
const selfWaitProbeDelay = 50 * time.Millisecond

// selfWaitProbe is a Postgres row-lock wait's probe (pgblocking.Probe):
// lockhooks knows no row a transaction holds, so after selfWaitProbeDelay
// it asks the server whether the statement waits for the transaction of
// holder, which it then names in the error.
type selfWaitProbe struct {
	*pgblocking.Probe
	holder holders.Holder
}

// probeSelfWait starts the probe of a row-lock wait w of c for the
// transaction of h.
func probeSelfWait(w *lockWait, c, h *conn) {
	pid, hpid := c.pin.PID.Load(), h.pin.PID.Load()
	if w == nil || pid == 0 || hpid == 0 {
		return
	}
	safe := func() bool { return c.endable() && h.endable() } // (a pooler seen since watchSelfWait)
	w.SetProbe(&selfWaitProbe{Probe: c.connector.Blocking.Probe(selfWaitProbeDelay, pid, hpid, safe), holder: holding.Of(h, []lockKey(nil))})
}

// selfWaitResult ends the self-wait probe of c's wait w, if any, and
// turns the cancellation it made into an error wrapping ErrSelfWait.
func selfWaitResult(w *lockWait, c *conn, statement string, err error) error {
	p, _ := w.TakeProbe().(*selfWaitProbe)
	if p == nil {
		return err
	}
	if !p.Stop() || dberr.SQLState(err) != "57014" {
		return err
	}
	e := fmt.Errorf("%w; Postgres cancelled the waiting statement: %w",
		inprocess.SelfWaitError(fmt.Sprintf("the statement %.120q", statement), "a row lock", p.holder), err)
	c.connector.Events.Add(eventSelfWait, e.Error())
	return e
}
