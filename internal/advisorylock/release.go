package advisorylock

import (
	"context"
	"errors"
	"fmt"

	"github.com/lockhooks/lockhooks/internal/dberr"
	"github.com/lockhooks/lockhooks/internal/pgsession"
)

// Abandon gives back the connection of an acquisition that failed. The
// failed statement may still have taken the lock: a lock_timeout,
// statement_timeout or cancel racing the grant, or a context that ended
// after the server's answer arrived but before it was read (database/sql
// then reports the context's error). The tracking, which the server
// confirms after any error, says whether the connection holds the key; if
// it does, the key is unlocked before the connection goes back to the
// pool, or, if that fails, the connection is closed for good (which ends
// its backend), so no lock stays behind on a parked connection for this
// process's next acquirer to wait on. The error-free path never gets here.
func (l *Lock[K]) Abandon() {
	defer l.Hold.Close()
	if !l.Pin.Holds(l.K) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.DB.CheckTimeout)
	defer cancel()
	ok, err := l.Hold.UnlockKey(ctx, false)
	if err == nil && ok && !l.Pin.Holds(l.K) {
		return
	}
	why := fmt.Sprintf("could not be unlocked after its acquire failed (unlock: %v, %v), so its connection is closed", ok, err)
	l.markLost(why, errors.New(why))
}

// markLost records that the locks of the lock's backend are gone, and has
// the backend ended where lockhooks may (pgsession.Conn.MarkLostOn).
func (l *Lock[K]) markLost(why string, cause error) {
	l.Pin.MarkLostOn(l.Pin.LockPID(), why, cause, pgsession.LossEnd)
}

// Unlock runs Release's unlock, even when ctx is done (defer
// l.Release(ctx) after a cancelled request: a skipped unlock would leave
// the lock on a parked connection, and the next acquirer waiting behind
// it), bounded by the database's CheckTimeout. If it fails and the
// connection still holds the key (the tracking, which the server confirms
// after any error, says so), it makes sure the key does not stay held:
// where the unlock failed because the transaction it ran in had failed
// (25P02), and that transaction was begun by statement text (one
// database/sql began belongs to the application's *sql.Tx), it rolls the transaction back and unlocks again; where that is not so
// or does not work (a timeout, say, which keeps the user's work), it takes
// the lock off its connection and marks the connection lost, so that it
// is closed instead of pooled (Hold.Settle closes a parked one; the
// caller's Release closes its own), which ends the session and the lock
// with it (its backend is ended too if it outlives the connection). The
// error says which.
func (l *Lock[K]) Unlock(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.DB.CheckTimeout)
	defer cancel()
	ok, err := l.unlockOnce(ctx)
	if err == nil && ok {
		return nil
	}
	if err == nil {
		err = fmt.Errorf("%w: pg_advisory_unlock(%d) returned false", pgsession.ErrNotLockOwner, l.Key)
	} else {
		err = fmt.Errorf("lockhooks: releasing advisory lock %s: %w", l.describe(), err)
	}
	if !l.Pin.Holds(l.K) {
		return err
	}
	if dberr.SQLState(err) == "25P02" && l.Hold.InTextTx() {
		if rerr := l.Hold.Exec(ctx, "ROLLBACK", false); rerr == nil {
			if ok, uerr := l.unlockOnce(ctx); uerr == nil && ok && !l.Pin.Holds(l.K) {
				return fmt.Errorf("%w; lockhooks rolled back the connection's transaction (its work was not committed) and unlocked the lock then", err)
			}
		}
	}
	if !l.Pin.Holds(l.K) {
		return err
	}
	// The turn stays taken until Release has closed the connection: the
	// loss must not free it.
	l.Hold.Detach()
	l.markLost(fmt.Sprintf("could not be unlocked at Release (%v), so its connection is closed", err), err)
	l.Hold.Settle() // (a parked connection, after Conn().Close(), is closed here)
	return fmt.Errorf("%w; the connection still held the lock, so lockhooks closed it instead of returning it to the pool, which releases the lock on the server", err)
}

// unlockOnce runs pg_advisory_unlock for the lock's key on its connection,
// or, if the caller gave the connection back (it is parked and still holds
// the lock), rerouted to it through the pool.
func (l *Lock[K]) unlockOnce(ctx context.Context) (ok bool, err error) {
	if _, err = l.Hold.FirstRow(ctx, "SELECT pg_advisory_unlock($1)", l.row[:1]); err == nil {
		ok, _ = l.row[0].(bool)
	}
	if l.Hold.Returned(err) {
		ok, err = l.Hold.UnlockKey(ctx, true)
	}
	return ok, err
}
