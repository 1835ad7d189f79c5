package pgsession

import (
	"database/sql/driver"
	"errors"
	"strings"
	"testing"
	"time"
)

// A loss takes every held lock, named in order, with the oldest; it
// records the error, changes Gen and keeps one channel to close.
func TestLoseHeldLocks(t *testing.T) {
	var s State[namedKey]
	s.Lock()
	defer s.Unlock()
	if keys, names, oldest := TakeHeldLocked(&s); keys != nil || names != "" || oldest != nil {
		t.Fatalf("nothing held: %v, %q, %v", keys, names, oldest)
	}
	s.AddLocked(namedKey{K1: 2}, "b.go:2", noSpan, 1)
	s.Held[namedKey{K1: 2}].Since = time.Now().Add(-time.Minute)
	s.AddLocked(namedKey{K1: 1}, "a.go:1", noSpan, 2)
	keys, names, oldest := TakeHeldLocked(&s)
	if len(keys) != 2 || names != "key 1, key 2" || oldest == nil || oldest.Site != "b.go:2" || s.Held != nil {
		t.Fatalf("TakeHeldLocked = %v, %q, %+v; held after %v", keys, names, oldest, s.Held)
	}
	gen := s.Gen
	s.Parked = true
	lost := errors.New("lost")
	ch, parked := s.SetLostLocked(lost)
	if s.Lost != lost || s.Gen == gen || !parked || ch == nil || ch != s.LostCh {
		t.Fatalf("after SetLostLocked: lost %v, gen %d (was %d), parked %v, channel %v", s.Lost, s.Gen, gen, parked, ch)
	}
}

// The backend of a loss is ended only where the rule allows it: asked
// for, the connection's own backend, reached directly, no pooler, its
// incarnation known; the log line says why not otherwise.
func TestEndOnLoss(t *testing.T) {
	keys := []namedKey{{K1: 7}}
	for _, c := range []struct {
		name                     string
		pid                      int32
		end, pooler, reaches     bool
		incarnation, wantBackend string
		wantEnd                  bool
	}{
		{"direct", 100, true, false, true, "1@2", "ended where it still holds", true},
		{"not asked", 100, false, false, true, "1@2", "left to the server's own timeouts", false},
		{"another backend", 101, true, false, true, "1@2", "left to the server's own timeouts", false},
		{"through a pooler", 100, true, true, true, "1@2", "a pooler stands between", false},
		{"not shown to reach the server", 100, true, false, false, "1@2", "does not show that the connection reached the server", false},
		{"incarnation unknown", 100, true, false, true, "", "left to the server's own timeouts", false},
	} {
		var conn Conn[namedKey]
		conn.PID.Store(100)
		conn.ReachesServer, conn.Incarnation = c.reaches, c.incarnation
		ends := NewEndQueue()
		backend := conn.EndOnLoss(c.pid, keys, c.end, c.pooler, ends)
		if !strings.Contains(backend, c.wantBackend) || ends.Empty() == c.wantEnd {
			t.Errorf("%s: backend %q (want %q), end requested %v (want %v)", c.name, backend, c.wantBackend, !ends.Empty(), c.wantEnd)
		}
	}
}

// A statement's error with a loss wraps both, except driver.ErrBadConn,
// which database/sql would retry on a fresh connection.
func TestLostError(t *testing.T) {
	lost, failed := errors.New("lock lost"), errors.New("statement failed")
	if err := LostError(nil, failed); err != failed {
		t.Errorf("without a loss: %v", err)
	}
	if err := LostError(lost, driver.ErrBadConn); err != lost {
		t.Errorf("with ErrBadConn: %v, want the loss alone", err)
	}
	if err := LostError(lost, failed); !errors.Is(err, lost) || !errors.Is(err, failed) {
		t.Errorf("with a statement's error: %v, want both wrapped", err)
	}
}
