package lockhooks

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
	"github.com/lockhooks/lockhooks/internal/dberr"
	"github.com/lockhooks/lockhooks/internal/pgdriver"
	"github.com/lockhooks/lockhooks/internal/pgserver"
	"github.com/lockhooks/lockhooks/internal/pgsession"
	"github.com/lockhooks/lockhooks/internal/rawconn"
)

// Reading the truth: pg_locks for one connection's backend, and making
// the tracking equal to it.

// reconcile reads pg_locks for this backend and makes the tracking equal
// to it (pgsession.State.ReconcileLocked: keys gone are forgotten, keys
// unknown learnt, pending[k] times for a try-lock of this statement whose
// outcome the text could not tell, negative for transaction-level ones;
// uncertain marks the counts approximate). A failed read is recorded
// (pgsession.State.ReadFailedLocked) and logged outside a transaction.
// The caller settles c afterwards; the error is the read's.
func (c *conn) reconcile(ctx context.Context, site string, pending map[lockKey]int, uncertain bool) error {
	ctx, cancel := context.WithTimeout(ctx, c.connector.opts.lockCheckTimeout)
	defer cancel()
	inTx := c.inTx()
	server, err := c.readAdvisoryLocks(ctx)
	if err != nil {
		c.pin.Lock()
		c.pin.ReadFailedLocked(dberr.SQLState(err) == "25P01", inTx)
		c.updateActiveLocked()
		c.pin.Unlock()
		if !inTx {
			c.connector.opts.logger.Warn("lockhooks: cannot read pg_locks to track advisory locks", "connection", c.String(), "error", err)
		}
		return err
	}
	now := time.Now()
	c.pin.Lock()
	c.pin.ReconcileLocked(server, pending, uncertain, inTx, site, now, c.sessionLockFreed)
	c.updateActiveLocked()
	c.pin.Unlock()
	return nil
}

// readAdvisoryLocks reads the advisory locks pg_locks shows for this
// connection's backend, on the connection itself.
//
// Inside a transaction the read runs in a savepoint, so that its failure
// cannot abort the application's transaction.
func (c *conn) readAdvisoryLocks(ctx context.Context) (lockSet, error) {
	if _, err := c.backendPID(ctx); err != nil {
		return nil, err
	}
	if c.connector.opts.txPooler {
		// Session locks live only on a holder; the backend this connection
		// met at connect serves other clients now.
		return c.readHolderLocks(ctx)
	}
	pid := c.LockPID()
	if c.connector.opts.pinningPooler {
		pid = 0 // the backend that answers: the pooler moves the connection until it pins it
	}
	inTx := c.inTx()
	if inTx {
		if err := c.execOwn(ctx, "SAVEPOINT lockhooks_read"); err != nil {
			return nil, err
		}
	}
	held, ranOn, marker, err := c.queryOwnLocks(ctx, pid)
	switch {
	case err != nil:
	case c.connector.opts.pinningPooler:
		err = c.followPin(ranOn, len(held) > 0 && !inTx)
	case ranOn != pid:
		err = c.PoolerDetected(fmt.Sprintf("was opened on backend pid %d but its statements now run on backend pid %d", pid, ranOn))
		c.connector.pins.SawPooler(err)
	case c.mark != "" && marker != "" && marker != c.mark && strings.HasPrefix(marker, pgsession.MarkerPrefix):
		err = c.PoolerDetected(fmt.Sprintf("runs on backend pid %d, where another lockhooks connection was opened meanwhile", pid))
		c.connector.pins.SawPooler(err)
	}
	if inTx {
		end := "RELEASE SAVEPOINT lockhooks_read"
		if err != nil {
			end = "ROLLBACK TO SAVEPOINT lockhooks_read"
		}
		if endErr := c.execOwn(ctx, end); endErr != nil && err == nil {
			err = endErr
		}
	}
	if err != nil {
		return nil, c.observe(err)
	}
	return held, nil
}

// readHolderLocks reads, through a transaction pooler, the advisory locks
// of c's holder on the holder itself, inside its transaction: its own
// backend answers, so a holder that died (or is exiting, its locks already
// gone) is found lost, where a read of its pid from another server
// connection would find it empty, as if it had released them. The read runs
// with a bounded context of its own (a cancellation in the middle would
// make the driver close the holder).
func (c *conn) readHolderLocks(ctx context.Context) (lockSet, error) {
	pid := c.pin.Hold.PID()
	if c.pin.Hold.Conn() == nil || pid == 0 {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.connector.opts.lockCheckTimeout)
	defer cancel()
	held, ranOn, _, err := queryLocksOn(ctx, c.pin.Hold.Conn(), pid, "")
	if err == nil && ranOn != pid {
		err = fmt.Errorf("its holder answered from backend pid %d, not its own %d", ranOn, pid)
	}
	if err != nil {
		return nil, c.pin.Hold.Failed(err)
	}
	return held, nil
}

// queryOwnLocks reads the granted advisory locks of backend pid (0: of the
// backend that answers), and the pid and session marker of the backend
// that answers. On a connection that holds session locks, the holder's
// identity rides on the read (pg_identity_publish.go).
func (c *conn) queryOwnLocks(ctx context.Context, pid int32) (held lockSet, ranOn int32, marker string, err error) {
	query, args := c.ownLocksQuery(pid)
	return queryLocks(ctx, c.inner, query, args)
}

// queryLocksOn reads, on the connection on, the granted advisory locks of
// backend pid (0: of the backend that answers), and the pid and session
// marker of the backend that answers; suffix ends the query's text.
func queryLocksOn(ctx context.Context, on driver.Conn, pid int32, suffix string) (held lockSet, ranOn int32, marker string, err error) {
	return queryLocks(ctx, on, string(pgserver.AppendOwnLocksQuery(nil, "(SELECT 1) one", pid, suffix)), nil)
}

// lockSet is the advisory locks a pg_locks read found on a backend, each
// once.
type lockSet []lockKey

// has reports whether s holds k.
func (s lockSet) has(k lockKey) bool { return slices.Contains(s, k) }

// queryLocks runs a pg_locks read made by pgserver.AppendOwnLocksQuery on on.
func queryLocks(ctx context.Context, on driver.Conn, query string, args []driver.NamedValue) (held lockSet, ranOn int32, marker string, err error) {
	rows, err := rawconn.Query(ctx, on, query, args)
	if err != nil {
		return nil, 0, "", err
	}
	defer rows.Close()
	dest := make([]driver.Value, 1)
	if err := rows.Next(dest); err != nil {
		if err == io.EOF {
			err = errors.New("lockhooks: the pg_locks read returned no row")
		}
		return nil, 0, "", err
	}
	return parseLocksRow(pgdriver.AsString(dest[0]))
}

// parseLocksRow reads the row of a read made by
// pgserver.AppendOwnLocksQuery: the locks it names, each once.
func parseLocksRow(row string) (held lockSet, ranOn int32, marker string, err error) {
	ranOn, marker, err = pgserver.ParseOwnLocks(row, func(k advisorykey.Key) {
		if !held.has(lockKey(k)) {
			held = append(held, lockKey(k))
		}
	})
	if err != nil {
		return nil, 0, "", err
	}
	return held, ranOn, marker, nil
}

// markUnverified records that what c's backend holds is unknown: the read
// of pg_locks that had to follow a failed lock statement failed (the
// statement may have taken its lock: a lock_timeout racing the grant).
func (c *conn) markUnverified() {
	c.pin.Lock()
	c.pin.Unverified = true
	c.updateActiveLocked()
	c.pin.Unlock()
}

// verifyUnknown reads pg_locks for a connection whose holdings are
// unknown (markUnverified) and reports whether they are known now. It
// costs an atomic load on a connection lockhooks does not follow.
func (c *conn) verifyUnknown(ctx context.Context) bool {
	if !c.pin.Active.Load() {
		return true
	}
	c.pin.Lock()
	unverified := c.pin.Unverified
	c.pin.Unlock()
	if !unverified {
		return true
	}
	if err := c.reconcile(context.WithoutCancel(ctx), "unknown (found in pg_locks after a failed lock statement)", nil, true); err != nil {
		if c.connectionBroken(err) {
			c.loseLocks(err)
		}
		return false
	}
	c.connector.pins.Settle(c)
	return true
}

// verifyOnReturn reads pg_locks for a connection returned to the pool that
// lockhooks believes holds nothing (WithVerifyOnReturn): locks taken where
// no statement text showed them (a server-side function) are learnt, and
// the connection is then parked instead of pooled.
func (c *conn) verifyOnReturn() {
	ctx, cancel := context.WithTimeout(context.Background(), c.connector.opts.lockCheckTimeout)
	defer cancel()
	server, err := c.readAdvisoryLocks(ctx)
	if err != nil || len(server) == 0 {
		return
	}
	c.reconcile(ctx, "unknown (found in pg_locks when the connection was returned to the pool)", nil, true)
	c.connector.pins.Settle(c)
}

// heldView is what the tracking says a connection holds: session locks
// with their counts and the current transaction's locks (for tests).
type heldView struct {
	pid     int32
	session map[lockKey]int
	approx  map[lockKey]bool // session keys whose count may be off
	xact    map[lockKey]int
	lost    bool
	parked  bool
}

// view returns c's tracked locks.
func (c *conn) view() heldView {
	c.pin.Lock()
	defer c.pin.Unlock()
	v := heldView{pid: c.LockPID(), session: map[lockKey]int{}, approx: map[lockKey]bool{}, xact: map[lockKey]int{}, lost: c.pin.Lost != nil, parked: c.pin.Parked}
	for k, l := range c.pin.Held {
		v.session[k] = l.Count
		if l.Approx {
			v.approx[k] = true
		}
	}
	for k, n := range c.pin.Xact {
		v.xact[k] = n
	}
	return v
}
