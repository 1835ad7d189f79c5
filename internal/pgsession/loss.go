package pgsession

import (
	"database/sql/driver"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"
)

// Losing session locks: the transitions of a loss that need no connection.
// What the loss is called, and how it is reported (the log, the metric,
// the span, the event), is the caller's.

// ErrLockLost is wrapped by the errors that report a lock whose
// connection died or was closed, or that a statement of its own released
// behind its AdvisoryLock (the root package exports it).
var ErrLockLost = errors.New("lockhooks: lock lost")

// ErrTransactionPooler is wrapped by the errors of session advisory locks
// through a transaction-mode pooler (the root package exports it).
var ErrTransactionPooler = errors.New("lockhooks: session advisory lock through a transaction-mode pooler")

// MarkLostOn records that the session locks held by backend pid (the
// connection's lock backend, or a transaction pooler's holder whose pid
// the caller read before dropping it) are gone (why completes "…held
// advisory lock k and"), and returns the loss (nil if the connection held
// none; the first loss if it was lost already). Statements fail with it
// from now on. With LossEnd, the backend is ended where it still holds or
// awaits them, only where the package's rule allows it (EndOnLoss); with
// LossReport the host reports it; with LossPooler it wraps
// ErrTransactionPooler too. The channel of the loss closes last, so that
// whoever waits on it sees the report.
func (c *Conn[K]) MarkLostOn(pid int32, why string, cause error, flags LossFlags) error {
	c.Lock()
	if c.Lost != nil {
		defer c.Unlock()
		return c.Lost
	}
	if len(c.Held) == 0 {
		c.Unlock()
		return nil
	}
	held, keys, oldest := TakeHeldLocked(&c.State)
	n := len(held)
	lost := fmt.Errorf("%w: %v held advisory lock %s (taken at %s, %v ago) and %s; the work it protected must stop",
		ErrLockLost, c.host, keys, oldest.Site, time.Since(oldest.Since).Round(time.Millisecond), why)
	if flags&LossPooler != 0 {
		lost = fmt.Errorf("%w (%w)", lost, ErrTransactionPooler)
	}
	lostCh, parked := c.SetLostLocked(lost)
	c.UpdateLocked() // statements now fail with lost
	c.Unlock()

	// What becomes of the backend, for the log line.
	backend := c.EndOnLoss(pid, held, flags&LossEnd != 0, c.host.ThroughPooler(), c.host.Ends())
	if flags&LossReport != 0 {
		c.host.ReportLoss(Loss{PID: pid, Keys: keys, N: n, Oldest: oldest, Parked: parked, Err: lost, Cause: cause, Backend: backend})
	}
	c.host.LockLost()
	close(lostCh) // after the log, the count and the turn, so whoever waits on Lost sees them
	return lost
}

// Loss is one loss of a connection's session locks, as its report says
// it (Host.ReportLoss).
type Loss struct {
	PID     int32  // the backend that held them
	Keys    string // their names, joined
	N       int    // how many
	Oldest  *Held  // the one held longest
	Parked  bool   // the connection was parked
	Err     error  // the loss, as statements get it
	Cause   error  // what made it
	Backend string // what becomes of the backend
}

// TakeHeldLocked empties the session locks s holds and returns them: their
// keys, their names joined for a reader (sorted), and the oldest; no keys
// when it holds none. s is locked.
func TakeHeldLocked[K NamedKey](s *State[K]) (keys []K, names string, oldest *Held) {
	if len(s.Held) == 0 {
		return nil, "", nil
	}
	_, oldest = s.OldestLocked(nil)
	named := make([]string, 0, len(s.Held))
	keys = make([]K, 0, len(s.Held))
	for k := range s.Held {
		named = append(named, k.String())
		keys = append(keys, k)
	}
	sort.Strings(named)
	s.Held = nil
	return keys, strings.Join(named, ", "), oldest
}

// SetLostLocked records the loss lost: statements now fail with it (once
// the caller has recomputed Active), and Gen changes; it returns the
// channel to close once the loss is reported, and whether the connection
// was parked. s is locked.
func (s *State[K]) SetLostLocked(lost error) (lostCh chan struct{}, parked bool) {
	s.Lost = lost
	s.Gen++
	if s.LostCh == nil {
		s.LostCh = make(chan struct{})
	}
	return s.LostCh, s.Parked
}

// EndOnLoss has the monitor end, where the package's rule allows it, the
// backend pid that held keys when they were lost (end: the backend may
// still live, its socket half-open or given up on), and says for the log
// line what becomes of it. throughPooler: a pooler is declared or was
// seen between the connection and the server.
func (c *Conn[K]) EndOnLoss(pid int32, keys []K, end, throughPooler bool, ends *EndQueue) (backend string) {
	backend = "left to the server's own timeouts"
	switch {
	case end && pid != 0 && pid == c.PID.Load() && c.Endable(throughPooler) && c.Incarnation != "":
		ends.Add(c.EndTarget(), CoreKeys(keys), false)
		backend = "ended where it still holds or awaits the lock"
	case throughPooler:
		backend += " (a pooler stands between lockhooks and the server: the backend may serve another client by now)"
	case !c.ReachesServer:
		backend += " (the driver does not show that the connection reached the server itself)"
	}
	return backend
}

// LostError combines the lost-lock error with the driver's error err; a
// driver.ErrBadConn is not wrapped, so database/sql does not retry the
// protected work on a fresh connection. Without a loss it is err.
func LostError(lost, err error) error {
	if lost == nil {
		return err
	}
	if errors.Is(err, driver.ErrBadConn) {
		return lost
	}
	return fmt.Errorf("%w (the statement failed with: %w)", lost, err)
}
