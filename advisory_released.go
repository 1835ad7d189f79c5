package lockhooks

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
// AdvisoryLock holds. Another session may take the key at once, so from
// that statement on the AdvisoryLock is lost, as if its connection had
// died: Lost is closed, Err and every later statement on the connection
// report it, and the loss is logged and counted. Only the AdvisoryLock's
// key is reported lost: other session locks taken on its connection stay
// tracked, as the server still holds them, until Release gives the
// connection up (a lost connection is closed, never pooled, which releases
// them on the server).
//
// RESET ALL and the other resets of session settings release no advisory
// lock (only DISCARD ALL, pg_advisory_unlock_all and the end of the session
// do): they are not losses.

// releasedOnOwnConn is the cause an AdvisoryLock released by a statement on
// its own connection reports.
const releasedOnOwnConn = "released by a statement on its own connection"

// noteTaken records how l's key was taken on its connection (when, where,
// in which span), for the report of its loss should a statement on the
// connection release it: by then the tracking has forgotten the key.
func (l *AdvisoryLock) noteTaken() {
	l.c.pin.Lock()
	defer l.c.pin.Unlock()
	if h := l.c.pin.Held[lockKey{K1: l.key}]; h != nil {
		l.taken = heldLock{Since: h.Since, Site: h.Site, Span: h.Span}
	} else {
		l.taken = heldLock{Since: time.Now(), Site: "unknown"}
	}
}

// LoseIfReleased marks the AdvisoryLock living on c lost if c's tracking,
// just brought up to date after the statement text on c ("": a statement
// of the transaction that just ended, read once it ended), no longer holds
// the lock's key: the statement released it. The caller
// settles c afterwards. Release's own unlock never gets here: Release
// takes the lock off c (c.advisory) before it unlocks.
func (c *conn) LoseIfReleased(text string) {
	l := c.advisory.Load()
	if l == nil {
		return
	}
	k := lockKey{K1: l.key}
	c.pin.Lock()
	if c.pin.Lost != nil || c.pin.Closed || c.pin.Held[k] != nil {
		c.pin.Unlock()
		return
	}
	taken := l.taken
	by := "a statement of the transaction that just ended"
	if text != "" {
		by = fmt.Sprintf("%.200q", text)
	}
	ago := time.Since(taken.Since).Round(time.Millisecond)
	cause := errors.New(releasedOnOwnConn + " (" + by + ")")
	lost := fmt.Errorf("%w: advisory lock %s (taken at %s, %v ago) held on %v was %s; the work it protected must stop, as another session may hold the lock now; end the lock with AdvisoryLock.Release, not by unlocking it on its connection (pg_advisory_unlock, pg_advisory_unlock_all, DISCARD ALL)",
		ErrLockLost, describeKey(l.key), taken.Site, ago, c, cause)
	lostCh, parked := c.pin.SetLostLocked(lost)
	c.pin.UpdateLocked() // statements now fail with lost
	c.pin.Unlock()

	c.ReportLoss(pgsession.Loss{PID: c.LockPID(), Keys: k.String(), N: 1, Oldest: &taken, Parked: parked, Err: lost, Cause: cause})
	l.freeTurn()  // another acquirer of this process may take the key at once
	close(lostCh) // after the log, the count and the turn, so whoever waits on Lost sees them
}
