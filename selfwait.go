package lockhooks

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/lockhooks/lockhooks/internal/sqlscan"
)

// Self-waits: a statement that would wait for a lock held by a transaction
// of its own call chain. The usual mistake is a statement run on the
// *sql.DB inside a transaction, with the transaction's context, instead of
// on the transaction:
//
//	lockhooks.RunInTx(ctx, db, nil, func(tx *sql.Tx) error {
//		tx.ExecContext(ctx, "UPDATE jobs …")   // takes the row (or SQLite's writer lock)
//		db.ExecContext(ctx, "UPDATE jobs …")   // waits for tx, which waits for it
//	})
//
// Such a wait can end only by its timeout; lockhooks fails it at once
// with an error wrapping ErrSelfWait, which RunInTx does not retry.

// ErrSelfWait is wrapped by the error of a statement (or BeginTx, Lock,
// AcquireAdvisoryLock) that would wait for a lock held by a transaction of
// its own call chain: one begun by the same goroutine with the very context
// the statement runs with. Such a wait could end only by its timeout. Run
// the statement through the transaction (tx.ExecContext, not
// db.ExecContext). Another goroutine, or the same goroutine with another
// context, is never suspected: it waits as before. (On architectures other
// than amd64 and arm64, where lockhooks cannot tell goroutines apart
// cheaply, no wait is taken for a self-wait.)
var ErrSelfWait = errors.New("lockhooks: a statement would wait for a lock its own call chain's transaction holds")

// sameContext reports whether a and b are the same context value. A
// context type that cannot be compared is never the same.
func sameContext(a, b context.Context) (same bool) {
	if a == nil || b == nil {
		return false
	}
	defer func() {
		if recover() != nil {
			same = false // an uncomparable value inside a comparable-looking context
		}
	}()
	return a == b
}

// sameCallChain reports whether work run with ctx on the current goroutine
// belongs to the call chain that took a lock (or began a transaction) with
// holderCtx on goroutine holderG (currentG): the same goroutine, with the
// same context. The goroutine alone would do (it is blocked in the wait,
// so it cannot release the lock), but a transaction handed to another
// goroutine to finish is not a self-wait, and its context tells.
func sameCallChain(ctx, holderCtx context.Context, holderG uintptr) bool {
	g := currentG()
	return g != 0 && g == holderG && sameContext(ctx, holderCtx)
}

// selfWaitError is the error of a wait (by waiter) for what, which h
// holds for the waiter's own call chain.
func selfWaitError(waiter, what string, h holder) error {
	return fmt.Errorf("%w: %s would wait for %s, which %s holds: that transaction (or lock) was begun by this same goroutine with this same context, so it cannot end while this call waits; run the statement through the transaction (tx.ExecContext, not db.ExecContext), or commit it first",
		ErrSelfWait, waiter, what, h)
}

// selfWaitHolder returns the transaction of another Postgres connection of
// any lockhooks database of the process that ctx's call chain began (see
// sameCallChain), or nil. It looks at every open connection, so it is
// called only on the way to a wait that may be one.
func selfWaitHolder(ctx context.Context, except *conn) *conn {
	if currentG() == 0 {
		return nil
	}
	databases.mu.RLock()
	defer databases.mu.RUnlock()
	for _, c := range databases.dbs {
		if c.opts.dialect != Postgres {
			continue
		}
		c.liveMu.RLock()
		for oc := range c.live {
			if oc == except {
				continue
			}
			if oc.ident.g.Load() != currentG() {
				continue // cheap: most transactions are other goroutines'
			}
			_, _, _, txCtx, open := oc.ident.snapshot()
			if open && sameCallChain(ctx, txCtx, oc.ident.g.Load()) {
				c.liveMu.RUnlock()
				return oc
			}
		}
		c.liveMu.RUnlock()
	}
	return nil
}

// selfWaitAdvisory fails a blocking request for Postgres advisory keys
// that a transaction of the caller's own call chain holds (on another
// connection of any lockhooks database of the process): Lock (names gives
// its keys' lockset ids), or a pg_advisory_lock / pg_advisory_xact_lock
// statement.
func (c *conn) selfWaitAdvisory(ctx context.Context, waiter string, keys []lockKey, names map[int64]string) error {
	if len(keys) == 0 {
		return nil
	}
	h := selfWaitHolder(ctx, c)
	if h == nil {
		return nil
	}
	h.pin.mu.Lock()
	var held lockKey
	found := false
	for _, k := range keys {
		for _, hk := range conflicting(k) {
			if h.pin.xact[hk] > 0 || h.pin.held[hk] != nil {
				held, found = hk, true
			}
		}
	}
	h.pin.mu.Unlock()
	if !found {
		return nil
	}
	what := "advisory key " + held.String()
	if name := names[held.k1]; name != "" {
		what = "lockset id " + name + " (" + what + ")"
	}
	return selfWaitError(waiter, what, h.asHolder([]lockKey{held}))
}

// selfWaitProbeDelay is how long a Postgres row-lock wait that may be a
// self-wait runs before lockhooks asks the server whose lock it waits for.
const selfWaitProbeDelay = 50 * time.Millisecond

// selfWaitProbe watches a Postgres row-lock wait while a transaction of
// the same call chain is open on another connection: lockhooks knows no
// row a transaction holds, so after selfWaitProbeDelay it asks the server,
// on a side connection, whether the statement waits for that transaction
// and, in the same statement, cancels it if so.
type selfWaitProbe struct {
	stop   chan struct{}
	done   chan struct{}
	holder holder
	hit    atomic.Bool // the probe cancelled the statement
}

// probeSelfWait starts the probe of a row-lock wait of c for the
// transaction of h.
func (w *lockWait) probeSelfWait(c, h *conn) {
	pid, hpid := c.pid.Load(), h.pid.Load()
	if w == nil || pid == 0 || hpid == 0 {
		return
	}
	p := &selfWaitProbe{stop: make(chan struct{}), done: make(chan struct{}), holder: h.asHolder(nil)}
	w.self = p
	go func() {
		defer close(p.done)
		t := time.NewTimer(selfWaitProbeDelay)
		defer t.Stop()
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), blockerLookupTimeout)
		defer cancel()
		side, err := c.connector.inner.Connect(ctx)
		if err != nil {
			return
		}
		defer side.Close()
		// Checked and cancelled in one statement: the backend still waits
		// for a lock, and the transaction's backend blocks it.
		rows, err := queryDirect(ctx, side, fmt.Sprintf(`SELECT pg_cancel_backend(a.pid) FROM pg_stat_activity a
WHERE a.pid = %d AND a.wait_event_type = 'Lock' AND %d = ANY (pg_blocking_pids(a.pid))`, pid, hpid), nil)
		if err != nil {
			return
		}
		defer rows.Close()
		dest := make([]driver.Value, 1)
		if rows.Next(dest) == nil {
			if ok, _ := dest[0].(bool); ok {
				p.hit.Store(true)
			}
		}
	}()
}

// selfWaitResult ends the wait's self-wait probe, if any, and turns the
// cancellation it made into an error wrapping ErrSelfWait.
func (w *lockWait) selfWaitResult(c *conn, statement string, err error) error {
	if w == nil || w.self == nil {
		return err
	}
	p := w.self
	w.self = nil
	close(p.stop)
	<-p.done // a cancel in flight must not meet a later statement unexplained
	if !p.hit.Load() || sqlState(err) != "57014" {
		return err
	}
	e := fmt.Errorf("%w; Postgres cancelled the waiting statement: %w",
		selfWaitError(fmt.Sprintf("the statement %.120q", statement), "a row lock", p.holder), err)
	c.connector.events.add(eventSelfWait, e.Error())
	return e
}

// waitingKeys returns the known keys of a statement's calls that wait
// (pg_advisory_lock and pg_advisory_xact_lock, shared or not).
func waitingKeys(adv *sqlscan.Advisory, keys []lockKey, known []bool) []lockKey {
	var out []lockKey
	for i, call := range adv.Calls {
		if call.Func&(sqlscan.FnTry|sqlscan.FnUnlock|sqlscan.FnUnlockAll) == 0 && known[i] {
			out = append(out, keys[i])
		}
	}
	return out
}
