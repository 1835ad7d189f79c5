package pgsession

import (
	"database/sql/driver"
	"errors"
	"fmt"
	"sort"
	"strings"
)

// Losing session locks: the transitions of a loss that need no connection.
// What the loss is called, and how it is reported (the log, the metric,
// the span, the event), is the caller's.

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
