package pgsession

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/lockhooks/lockhooks/internal/dberr"
	"github.com/lockhooks/lockhooks/internal/rawconn"
)

// TxPooler is what the holders of one database's connections share
// through a declared transaction pooler ([TxHolder]).
type TxPooler struct {
	// Settings are the database's: CheckTimeout bounds each of a holder's
	// statements (its clean end on db.Close is bounded by CloseLimit
	// too), Own is what the driver allows lockhooks' own statements.
	*Settings
	// Connect opens a holder's connection, outside the pool.
	Connect func(ctx context.Context) (driver.Conn, error)
	// Closing is closed by db.Close: a holder's waits stop.
	Closing <-chan struct{}
}

// CloseLimit bounds the clean end of a holder's transaction during
// db.Close.
const CloseLimit = 250 * time.Millisecond

// Polling bounds for a blocking lock through a transaction pooler
// ([TxHolder.PollLock]).
const (
	PollMin = 5 * time.Millisecond
	PollMax = 250 * time.Millisecond
)

// ErrClosing is [TxHolder.PollLock]'s error when db.Close ends the wait.
var ErrClosing = errors.New("lockhooks: the database was closed while the lock was awaited")

// HolderHost is the connection whose session locks a [TxHolder] keeps.
type HolderHost interface {
	fmt.Stringer
	// HolderLost records that the session locks on backend pid are lost
	// with their holder, whose statement failed outside the server's
	// control with err, and returns the error to give the caller.
	HolderLost(pid int32, err error) error
	// ReleaseLockSavepoint ends the savepoint of a lock statement run on
	// the holder's connection h (naming the holder there, where the
	// connection publishes identities).
	ReleaseLockSavepoint(ctx context.Context, h driver.Conn) error
	// HoldsNothing reports whether the connection holds no session lock.
	HoldsNothing() bool
}

// TxHolder is a connection's session locks through a declared
// transaction pooler: its [Holder] and the statements lockhooks runs
// there. Holder statements are short (a try, an unlock; a blocking lock
// polls) and run with a bounded context of their own: a caller's
// cancellation in the middle of one would make the driver close the
// holder, and every other lock on it would be lost; the caller's context
// is checked first. Its zero value has no holder; Init readies it.
type TxHolder struct {
	Holder
	db   *TxPooler
	host HolderHost
}

// Init readies t to keep host's session locks through db's pooler.
func (t *TxHolder) Init(db *TxPooler, host HolderHost) { t.db, t.host = db, host }

// Run runs a session-lock statement on the holder, in a savepoint so that
// a failed lock (a deadlock, a lock_timeout) does not abort the
// transaction that keeps the other locks, and returns its one row.
func (t *TxHolder) Run(ctx context.Context, query string, args []driver.NamedValue) (*rawconn.Row, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), t.db.CheckTimeout)
	defer cancel()
	h, err := t.open(ctx)
	if err != nil {
		return nil, err
	}
	if err := rawconn.Exec(ctx, h, "SAVEPOINT lockhooks_lock"); err != nil {
		return nil, t.Failed(err)
	}
	rows, err := rawconn.Query(ctx, h, query, args)
	var answer *rawconn.Row
	if err == nil {
		answer, err = rawconn.ReadRow(rows)
	}
	if err != nil {
		if !dberr.FromServer(err) {
			return nil, t.Failed(err)
		}
		if rerr := rawconn.Exec(ctx, h, "ROLLBACK TO SAVEPOINT lockhooks_lock"); rerr != nil {
			return nil, t.Failed(rerr)
		}
		return nil, err
	}
	if err := t.host.ReleaseLockSavepoint(ctx, h); err != nil {
		return nil, t.Failed(err)
	}
	return answer, nil
}

// PollLock takes a lone blocking lock on the holder by polling with try
// (its pg_try_advisory_lock, bound by args) instead of waiting on the
// server: a waiting statement would keep one of the pooler's few server
// connections busy for as long as it waits (one per waiting replica), and
// the holder's own work could find none left. Between tries the holder's
// transaction ends, so it keeps no server connection either. It returns
// once the lock is taken (nil), ctx ends (its error), or db.Close ends
// the wait ([ErrClosing]).
func (t *TxHolder) PollLock(ctx context.Context, try string, args []driver.NamedValue) error {
	delay := PollMin
	for {
		answer, err := t.Run(ctx, try, args)
		if err != nil {
			return err
		}
		if got, _ := answer.Values()[0].(bool); got {
			return nil
		}
		t.EndIfEmpty()
		timer := time.NewTimer(delay/2 + rand.N(delay/2+1))
		select {
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		case <-t.db.Closing:
			timer.Stop()
			return ErrClosing
		case <-timer.C:
		}
		delay = min(2*delay, PollMax)
	}
}

// open returns the holder's connection, opening it and its transaction if
// needed.
func (t *TxHolder) open(ctx context.Context) (driver.Conn, error) {
	if t.Conn() == nil {
		inner, err := t.db.Connect(ctx)
		if err != nil {
			return nil, fmt.Errorf("lockhooks: opening the connection that holds session locks through the transaction pooler: %w", err)
		}
		t.Open(inner)
	}
	if !t.InTx() {
		// (TestPoolerHolderBackend checks the pid Begin reads against the
		// backend that holds the locks; a wrong one would also fail every
		// read of the holder's locks: "its holder answered from backend
		// pid …")
		if err := t.Begin(ctx, t.db.Own.Of(t.Conn())); err != nil {
			return nil, t.Failed(err)
		}
	}
	return t.Conn(), nil
}

// Failed drops a holder whose statement failed outside the server's
// control with err: its transaction, and the locks it kept, are gone. It
// returns the host's error for the loss.
//
// Whatever its backend still holds or awaits stays there until the pooler
// drops it: a backend behind a pooler is never ended (see the package's
// rule), since the pooler may have given it to another client already.
// PgBouncer closes a server connection whose client left mid-transaction,
// which ends the backend and frees its locks.
func (t *TxHolder) Failed(err error) error {
	return t.host.HolderLost(t.Drop(), err)
}

// Check confirms, before a statement of the protected work runs on the
// connection (not on its holder), that the holder keeping its session
// locks is still there: through a transaction pooler the statement runs on
// another server connection, so nothing else would stop it from running
// after the lock was lost. It costs one round trip (a ping of the holder)
// per such statement while the connection holds session locks, and
// nothing otherwise.
func (t *TxHolder) Check(ctx context.Context) error {
	if !t.InTx() || t.PID() == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	// The ping runs with a bounded context of its own: the caller's
	// cancellation in the middle of it would make the driver close the
	// holder, and every lock on it would be lost.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), t.db.CheckTimeout)
	defer cancel()
	if err := t.Ping(ctx); err != nil {
		return t.Failed(fmt.Errorf("its holder did not answer a ping: %w", err))
	}
	return nil
}

// EndIfEmpty ends the holder's transaction once the connection holds
// nothing: the pooler may then give its server connection to others.
func (t *TxHolder) EndIfEmpty() {
	if !t.InTx() {
		return // no holder transaction (nor a host, before Init)
	}
	if t.host.HoldsNothing() {
		t.endTxWithin(t.db.CheckTimeout)
	}
}

// Shut closes the holder, releasing what it holds (its connection is
// being closed).
func (t *TxHolder) Shut() {
	if t.Conn() == nil {
		return
	}
	limit := t.db.CheckTimeout
	select {
	case <-t.db.Closing:
		// db.Close: a silent network must not stretch it. Past this the
		// holder is just closed; the pooler drops the server connection of
		// a client that left in the middle of a transaction, and its locks
		// with it (a clean end, when it comes in time, spares the pooler
		// that churn).
		limit = min(limit, CloseLimit)
	default:
	}
	t.endTxWithin(limit)
	t.Close()
}

// endTxWithin ends the holder's transaction, within limit (Holder.EndTx:
// its locks released, or the holder closed).
func (t *TxHolder) endTxWithin(limit time.Duration) {
	if !t.InTx() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	t.EndTx(ctx)
}
