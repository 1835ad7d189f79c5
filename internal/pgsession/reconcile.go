package pgsession

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
	"github.com/lockhooks/lockhooks/internal/rawconn"
)

// Reading the truth: pg_locks for one connection's backend, and making
// the tracking equal to it.

// Reconcile reads pg_locks for the connection's backend and makes the
// tracking equal to it (State.ReconcileLocked: keys gone are forgotten,
// keys unknown learnt, pending[k] times for a try-lock of this statement
// whose outcome the text could not tell, negative for transaction-level
// ones; uncertain marks the counts approximate; site is where keys learnt
// were taken, as far as anyone knows). A failed read is recorded
// (State.ReadFailedLocked) and logged outside a transaction. The caller
// settles the connection afterwards; the error is the read's.
func (c *Conn[K]) Reconcile(ctx context.Context, site string, pending map[K]int, uncertain bool) error {
	ctx, cancel := context.WithTimeout(ctx, c.set.CheckTimeout)
	defer cancel()
	inTx := c.host.InTx()
	server, err := c.ReadLocks(ctx)
	if err != nil {
		c.Lock()
		c.ReadFailedLocked(dberr.SQLState(err) == "25P01", inTx)
		c.UpdateLocked()
		c.Unlock()
		if !inTx {
			c.set.Logger.Warn("lockhooks: cannot read pg_locks to track advisory locks", "connection", c.host.String(), "error", err)
		}
		return err
	}
	now := time.Now()
	c.Lock()
	c.ReconcileLocked(server, pending, uncertain, inTx, site, now, c.host.HoldEnded)
	c.UpdateLocked()
	c.Unlock()
	return nil
}

// ReadLocks reads the advisory locks pg_locks shows for the connection's
// backend, on the connection itself (through a declared transaction
// pooler, on its holder). It also checks that the backend that answers is
// the connection's: through a session-pinning pooler it follows the pin
// (FollowPin); otherwise another backend, or another connection's marker
// on this one, proves a transaction-mode pooler nobody declared.
//
// Inside a transaction the read runs in a savepoint, so that its failure
// cannot abort the application's transaction.
func (c *Conn[K]) ReadLocks(ctx context.Context) ([]K, error) {
	if _, err := c.host.BackendPID(ctx); err != nil {
		return nil, err
	}
	if c.set.TxPooler {
		// Session locks live only on a holder; the backend this connection
		// met at connect serves other clients now.
		return c.readHolderLocks(ctx)
	}
	pid := c.LockPID()
	if c.set.PinningPooler {
		pid = 0 // the backend that answers: the pooler moves the connection until it pins it
	}
	inTx := c.host.InTx()
	if inTx {
		if err := c.host.ExecOwn(ctx, "SAVEPOINT lockhooks_read"); err != nil {
			return nil, err
		}
	}
	held, ranOn, marker, err := c.readOwnLocks(ctx, pid)
	switch mark := c.host.SessionMarker(); {
	case err != nil:
	case c.set.PinningPooler:
		err = c.FollowPin(ranOn, len(held) > 0 && !inTx)
	case ranOn != pid:
		err = c.host.PoolerDetected(fmt.Sprintf("was opened on backend pid %d but its statements now run on backend pid %d", pid, ranOn))
		c.host.SawPooler(err)
	case mark != "" && marker != "" && marker != mark && strings.HasPrefix(marker, MarkerPrefix):
		err = c.host.PoolerDetected(fmt.Sprintf("runs on backend pid %d, where another lockhooks connection was opened meanwhile", pid))
		c.host.SawPooler(err)
	}
	if inTx {
		end := "RELEASE SAVEPOINT lockhooks_read"
		if err != nil {
			end = "ROLLBACK TO SAVEPOINT lockhooks_read"
		}
		if endErr := c.host.ExecOwn(ctx, end); endErr != nil && err == nil {
			err = endErr
		}
	}
	if err != nil {
		return nil, c.host.Observe(err)
	}
	return held, nil
}

// readHolderLocks reads, through a transaction pooler, the advisory locks
// of the connection's holder on the holder itself, inside its
// transaction: its own backend answers, so a holder that died (or is
// exiting, its locks already gone) is found lost, where a read of its pid
// from another server connection would find it empty, as if it had
// released them. The read runs with a bounded context of its own (a
// cancellation in the middle would make the driver close the holder).
func (c *Conn[K]) readHolderLocks(ctx context.Context) ([]K, error) {
	pid := c.Hold.PID()
	if c.Hold.Conn() == nil || pid == 0 {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.set.CheckTimeout)
	defer cancel()
	held, ranOn, _, err := ReadLocksOn[K](ctx, c.Hold.Conn(), pid, "")
	if err == nil && ranOn != pid {
		err = fmt.Errorf("its holder answered from backend pid %d, not its own %d", ranOn, pid)
	}
	if err != nil {
		return nil, c.Hold.Failed(err)
	}
	return held, nil
}

// readOwnLocks reads, on the connection, the granted advisory locks of
// backend pid (0: of the backend that answers), and the pid and session
// marker of the backend that answers. On a connection that holds session
// locks, the holder's identity rides on the read (OwnLocksQuery), in a
// text the driver does not cache; through a declared transaction pooler
// the connection's own backend serves others, and nothing is annotated.
func (c *Conn[K]) readOwnLocks(ctx context.Context, pid int32) (held []K, ranOn int32, marker string, err error) {
	own := c.set.Own
	query, annotated := c.OwnLocksQuery(pid, c.Discards.Load(), own.OK() && !c.set.TxPooler)
	var args []driver.NamedValue
	if annotated {
		args = own.Args // a text of this hold's: not for pgx's statement cache
	}
	return readLocks[K](ctx, c.host.Unwrap(), query, args)
}

// ReadLocksOn reads, on the connection on, the granted advisory locks of
// backend pid (0: of the backend that answers), each once, and the pid
// and session marker of the backend that answers; suffix ends the query's
// text.
func ReadLocksOn[K Key](ctx context.Context, on driver.Conn, pid int32, suffix string) (held []K, ranOn int32, marker string, err error) {
	return readLocks[K](ctx, on, string(pgserver.AppendOwnLocksQuery(nil, "(SELECT 1) one", pid, suffix)), nil)
}

// readLocks runs a pg_locks read made by pgserver.AppendOwnLocksQuery on on.
func readLocks[K Key](ctx context.Context, on driver.Conn, query string, args []driver.NamedValue) (held []K, ranOn int32, marker string, err error) {
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
	return ParseLocksRow[K](pgdriver.AsString(dest[0]))
}

// ParseLocksRow reads the row of a read made by
// pgserver.AppendOwnLocksQuery: the locks it names, each once, and the
// pid and marker of the backend that answered.
func ParseLocksRow[K Key](row string) (held []K, ranOn int32, marker string, err error) {
	ranOn, marker, err = pgserver.ParseOwnLocks(row, func(k advisorykey.Key) {
		if !slices.Contains(held, K(k)) {
			held = append(held, K(k))
		}
	})
	if err != nil {
		return nil, 0, "", err
	}
	return held, ranOn, marker, nil
}

// MarkUnverified records that what the connection's backend holds is
// unknown: the read of pg_locks that had to follow a failed lock
// statement failed (the statement may have taken its lock: a
// lock_timeout racing the grant).
func (c *Conn[K]) MarkUnverified() {
	c.Lock()
	c.Unverified = true
	c.UpdateLocked()
	c.Unlock()
}

// VerifyUnknown reads pg_locks for a connection whose holdings are
// unknown (MarkUnverified) and reports whether they are known now; a
// read that fails because the connection broke loses its locks. It costs
// an atomic load on a connection lockhooks does not follow.
func (c *Conn[K]) VerifyUnknown(ctx context.Context) bool {
	if !c.Active.Load() {
		return true
	}
	c.Lock()
	unverified := c.Unverified
	c.Unlock()
	if !unverified {
		return true
	}
	if err := c.Reconcile(context.WithoutCancel(ctx), "unknown (found in pg_locks after a failed lock statement)", nil, true); err != nil {
		if c.host.ConnectionBroken(err) {
			c.host.LoseLocks(err)
		}
		return false
	}
	c.host.Settle()
	return true
}

// VerifyOnReturn reads pg_locks for a connection returned to the pool
// that lockhooks believes holds nothing (WithVerifyOnReturn): locks taken
// where no statement text showed them (a server-side function) are
// learnt, and the connection is then parked instead of pooled.
func (c *Conn[K]) VerifyOnReturn() {
	ctx, cancel := context.WithTimeout(context.Background(), c.set.CheckTimeout)
	defer cancel()
	server, err := c.ReadLocks(ctx)
	if err != nil || len(server) == 0 {
		return
	}
	c.Reconcile(ctx, "unknown (found in pg_locks when the connection was returned to the pool)", nil, true)
	c.host.Settle()
}

// FollowPin is the check, through a session-pinning pooler, of a read of
// pg_locks that ran on backend ranOn, right after a statement of the
// connection; holding says the read found advisory locks there outside a
// transaction (session locks, which pin the connection). Until the
// connection is pinned, ranOn becomes its backend; once pinned, another
// backend means the pooler did not pin it.
func (c *Conn[K]) FollowPin(ranOn int32, holding bool) error {
	c.Lock()
	defer c.Unlock()
	if to := c.PinnedTo; to != 0 && to != ranOn {
		return c.host.PoolerDetected(fmt.Sprintf("held session locks on backend pid %d, pinned there by the pooler (WithSessionPinningPooler), but its statements now run on backend pid %d, so the pooler does not pin it", to, ranOn))
	}
	c.PID.Store(ranOn)
	if holding {
		c.PinnedTo = ranOn
	}
	return nil
}

// PinnedUntilClosed reports whether a session-pinning pooler keeps the
// connection pinned until it disconnects: it has held a session lock.
func (c *Conn[K]) PinnedUntilClosed() bool {
	if !c.set.PinningPooler {
		return false
	}
	c.Lock()
	defer c.Unlock()
	return c.EverHeld
}

// Answers reports whether the parked connection still answers a
// statement of lockhooks' own (OnParked); one whose connection broke is
// lost.
func (c *Conn[K]) Answers(ctx context.Context) bool {
	return c.OnParked(ctx, func(ctx context.Context) error { return c.host.ExecOwn(ctx, "SELECT 1") })
}

// VerifyParked reads pg_locks on the parked connection (OnParked): one
// that fails is lost, one that works makes the tracking true.
func (c *Conn[K]) VerifyParked(ctx context.Context) {
	c.OnParked(ctx, func(ctx context.Context) error { return c.Reconcile(ctx, "unknown", nil, false) })
}

// OnParked runs run, lockhooks' own statements, on the parked connection
// under its Exec mutex and bounded by the check timeout, unless the
// connection was closed meanwhile; a failure because the connection broke
// loses its locks with that cause. It reports whether run ran and
// succeeded.
func (c *Conn[K]) OnParked(ctx context.Context, run func(context.Context) error) bool {
	c.Exec.Lock()
	defer c.Exec.Unlock()
	c.Lock()
	closed := c.Closed
	c.Unlock()
	if closed {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, c.set.CheckTimeout)
	defer cancel()
	if err := run(ctx); err != nil {
		if !dberr.FromServer(err) || c.host.ConnectionBroken(err) {
			c.host.LoseLocks(err)
		}
		return false
	}
	return true
}
