package pgsession

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
	"github.com/lockhooks/lockhooks/internal/rawconn"
	"github.com/lockhooks/lockhooks/internal/sqlscan"
)

// Statements through poolers: which of a statement's advisory calls run
// on the holder through a declared transaction pooler, what cannot be
// split there, and a statement refused once a pooler nobody declared was
// seen.

// PoolerError is the error for connection c found on a backend other
// than the one it was opened on, or whose lock is not where it was taken
// (what says how).
func PoolerError(c fmt.Stringer, what string) error {
	return fmt.Errorf("%w: %v %s; this database's DSN goes through a transaction-mode pooler (such as PgBouncer with pool_mode = transaction), which gives the server connection to other clients after each transaction, so a session lock stays behind on it: open the database with lockhooks.WithTransactionPooler(), or use transaction-level locks (lockhooks.Lock)",
		ErrTransactionPooler, c, what)
}

// OnHolder reports whether a statement's advisory calls must run on the
// holder (a declared transaction pooler, session-level calls), and
// refuses what cannot be split from the statement's other work.
func (c *Conn[K]) OnHolder(adv *sqlscan.Advisory) (bool, error) {
	if !c.set.TxPooler || adv.DiscardAll {
		return false, nil
	}
	session, xact := 0, 0
	for _, call := range adv.Calls {
		if call.Func&sqlscan.FnXact != 0 {
			xact++
		} else {
			session++
		}
	}
	switch {
	case session == 0:
		// Transaction-level calls run in the application's transaction; a
		// text that only mentions advisory locks (pg_locks WHERE locktype =
		// 'advisory') is no lock statement.
		return false, nil
	case adv.Uncertain || !adv.TargetList || xact > 0 || (!adv.Simple && Blocking(adv)):
		return false, errors.New("lockhooks: through a transaction-mode pooler (WithTransactionPooler), session advisory locks are held on a connection of their own, and this statement mixes an advisory call with other work that cannot be split from it (or waits for several locks at once); take the lock in a statement of its own (SELECT pg_advisory_lock($1)), or use transaction-level locks (lockhooks.Lock)")
	}
	return true, nil
}

// Blocking reports whether a statement has a call that waits for a lock.
func Blocking(adv *sqlscan.Advisory) bool {
	for _, call := range adv.Calls {
		if call.Func&(sqlscan.FnTry|sqlscan.FnUnlock|sqlscan.FnUnlockAll|sqlscan.FnXact) == 0 {
			return true
		}
	}
	return false
}

// TakesSession reports whether a statement takes a session lock.
func TakesSession(adv *sqlscan.Advisory) bool {
	for _, call := range adv.Calls {
		if call.Func&(sqlscan.FnXact|sqlscan.FnUnlock|sqlscan.FnUnlockAll) == 0 {
			return true
		}
	}
	return false
}

// SplitConflict refuses, through a transaction pooler, a session lock on
// a key the connection holds as a transaction-level lock, and the
// reverse: the two run on different backends there, which would wait for
// each other, where one backend's own locks never conflict. keys and
// known are the key of each of adv's calls, where known.
func (c *Conn[K]) SplitConflict(adv *sqlscan.Advisory, keys []K, known []bool) error {
	c.Lock()
	defer c.Unlock()
	for i, call := range adv.Calls {
		if !known[i] || call.Func&(sqlscan.FnUnlock|sqlscan.FnUnlockAll) != 0 {
			continue
		}
		k := keys[i]
		excl := advisorykey.Exclusive(k)
		shared := shared(k)
		var other bool
		if call.Func&sqlscan.FnXact != 0 {
			other = c.Held[shared] != nil || c.Held[excl] != nil
		} else {
			other = c.Xact[shared] > 0 || c.Xact[excl] > 0
		}
		if other {
			return fmt.Errorf("lockhooks: through a transaction-mode pooler (WithTransactionPooler), %s(%s) on %v would wait for this connection's own lock on the same key, held on another server connection (session locks live on a holder connection there); do not mix session and transaction-level locks on one key", call.Func.Name(), k, c.host)
		}
	}
	return nil
}

// RunOnHolder runs a statement's session-lock calls (query, args; adv as
// scanned, key the first call's, where known) on the connection's
// holder; a lone blocking pg_advisory_lock polls with
// pg_try_advisory_lock there instead of waiting on the server
// (TxHolder.PollLock).
func (c *Conn[K]) RunOnHolder(ctx context.Context, adv *sqlscan.Advisory, key K, known bool, query string, args []driver.NamedValue) (*rawconn.Row, error) {
	if !adv.Simple || adv.Calls[0].Func&(sqlscan.FnTry|sqlscan.FnUnlock|sqlscan.FnUnlockAll) != 0 || !known {
		return c.Hold.Run(ctx, query, args)
	}
	try, tryArgs := TryQuery(key)
	if err := c.Hold.PollLock(ctx, try, tryArgs); err != nil {
		if errors.Is(err, ErrClosing) {
			return nil, fmt.Errorf("lockhooks: pg_advisory_lock%s(%s) on %v: the database was closed while the lock was awaited", SharedSuffix(key), key, c.host)
		}
		return nil, err
	}
	return rawconn.OneValue(adv.Calls[0].Column, nil), nil // pg_advisory_lock returns void
}

// RefuseThroughPooler fails a statement (adv: its advisory calls, nil
// for none), once a transaction-mode pooler is known (seen: its proof) on
// a database not opened with WithTransactionPooler, if it would take a
// session lock, or runs on a connection holding session locks (which are
// lost: they stay on a server connection others use). Nothing when seen
// is nil.
func (c *Conn[K]) RefuseThroughPooler(adv *sqlscan.Advisory, seen error) error {
	if seen == nil {
		return nil
	}
	if !c.HoldsNothing() {
		lost := c.MarkLostOn(c.LockPID(), "may no longer be held: "+seen.Error(), seen, LossReport|LossPooler)
		c.host.Settle()
		return lost
	}
	if adv != nil && TakesSession(adv) {
		return seen
	}
	return nil
}

// HoldsNothing reports whether the connection holds no session lock.
func (c *Conn[K]) HoldsNothing() bool {
	c.Lock()
	defer c.Unlock()
	return len(c.Held) == 0
}
