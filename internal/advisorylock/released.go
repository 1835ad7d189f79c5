package advisorylock

import (
	"errors"
	"fmt"
	"time"

	"github.com/lockhooks/lockhooks/internal/pgsession"
)

// A lock released under its AdvisoryLock: a statement on the lock's own
// connection (pg_advisory_unlock of its key, once more than it was taken
// there; pg_advisory_unlock_all; DISCARD ALL; an unlock whose key or
// effect only the server's pg_locks could tell) released the key the
// lock holds. Another session may take the key at once, so from that
// statement on the lock is lost, as if its connection had died: Lost is
// closed, Err and every later statement on the connection report it, and
// the loss is logged and counted. Only the lock's key is reported lost:
// other session locks taken on its connection stay tracked, as the server
// still holds them, until Release gives the connection up (a lost
// connection is closed, never pooled, which releases them on the server).
//
// RESET ALL and the other resets of session settings release no advisory
// lock (only DISCARD ALL, pg_advisory_unlock_all and the end of the session
// do): they are not losses.

// ReleasedOnOwnConn is the cause a lock released by a statement on its own
// connection reports.
const ReleasedOnOwnConn = "released by a statement on its own connection"

// NoteTaken records how the lock's key was taken on its connection (when,
// where, in which span), for the report of its loss should a statement on
// the connection release it: by then the tracking has forgotten the key.
func (l *Lock[K]) NoteTaken() {
	l.Pin.Lock()
	defer l.Pin.Unlock()
	if h := l.Pin.Held[l.K]; h != nil {
		l.taken = pgsession.Held{Since: h.Since, Site: h.Site, Span: h.Span}
	} else {
		l.taken = pgsession.Held{Since: time.Now(), Site: "unknown"}
	}
}

// Released marks the lock lost if its connection's tracking, just brought
// up to date after the statement text on it ("": a statement of the
// transaction that just ended, read once it ended), no longer holds the
// lock's key: the statement released it. ok is false where the key is
// still held (or the connection was lost or closed already). Otherwise the
// caller reports loss, frees the key's turn, and closes lostCh after (so
// that whoever waits on Lost sees the report), then settles the
// connection. Release's own unlock never gets here: Release takes the
// lock off its connection before it unlocks.
func (l *Lock[K]) Released(text string) (loss pgsession.Loss, lostCh chan struct{}, ok bool) {
	c := l.Pin
	c.Lock()
	if c.Lost != nil || c.Closed || c.Held[l.K] != nil {
		c.Unlock()
		return loss, nil, false
	}
	taken := l.taken
	by := "a statement of the transaction that just ended"
	if text != "" {
		by = fmt.Sprintf("%.200q", text)
	}
	ago := time.Since(taken.Since).Round(time.Millisecond)
	cause := errors.New(ReleasedOnOwnConn + " (" + by + ")")
	lost := fmt.Errorf("%w: advisory lock %s (taken at %s, %v ago) held on %s was %s; the work it protected must stop, as another session may hold the lock now; end the lock with AdvisoryLock.Release, not by unlocking it on its connection (pg_advisory_unlock, pg_advisory_unlock_all, DISCARD ALL)",
		pgsession.ErrLockLost, l.describe(), taken.Site, ago, l.Hold.String(), cause)
	lostCh, parked := c.SetLostLocked(lost)
	c.UpdateLocked() // statements now fail with lost
	c.Unlock()
	return pgsession.Loss{PID: c.LockPID(), Keys: l.K.String(), N: 1, Oldest: &taken, Parked: parked, Err: lost, Cause: cause}, lostCh, true
}
