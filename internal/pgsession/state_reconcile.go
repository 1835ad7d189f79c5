package pgsession

import (
	"slices"
	"time"
)

// ReconcileLocked makes the state equal to what pg_locks showed its
// backend holds (server: each granted advisory lock once), at now. Keys
// the server no longer shows are forgotten (freed is told each session
// lock's Since, for the hold-time metric), transaction-level ones too
// (released by ROLLBACK TO SAVEPOINT). Keys it shows that the state did
// not know are learnt: pending[k] times for a try-lock whose outcome the
// statement's text could not tell (negative: transaction-level ones),
// once otherwise. Counts the server cannot show are never lowered: after
// a statement whose effect the text did not show (uncertain), keys held
// before and after are marked Approx, and so are keys learnt without a
// count. Inside a transaction (inTx), a key the transaction took as a
// transaction-level lock is not learnt as a session lock, and Recheck asks
// for another read once the transaction ends. The state is verified after
// it, and Gen changes.
func (s *State[K]) ReconcileLocked(server []K, pending map[K]int, uncertain, inTx bool, site string, now time.Time, freed func(since time.Time)) {
	for k, l := range s.Held {
		if !slices.Contains(server, k) {
			delete(s.Held, k)
			freed(l.Since)
		}
	}
	for k := range s.Xact {
		if !slices.Contains(server, k) {
			delete(s.Xact, k) // released by ROLLBACK TO SAVEPOINT
		}
	}
	for _, k := range server {
		n := pending[k]
		switch {
		case n < 0:
			if s.Xact == nil {
				s.Xact = make(map[K]int)
			}
			s.Xact[k] -= n
		case s.Held[k] != nil:
			if uncertain {
				s.Held[k].Approx = true
			}
		case inTx && s.Xact[k] > 0:
			// the transaction's own lock (a session lock on the same key
			// taken by a statement lockhooks cannot read is found at the end)
		default:
			if s.Held == nil {
				s.Held = make(map[K]*Held)
			}
			// A key it did not know: taken by this statement's try-lock
			// (pending: that many times), or where no text showed how
			// often (pg_locks shows no counts), so the count may be off.
			s.Held[k] = &Held{Count: max(n, 1), Since: now, Site: site, Approx: uncertain || n == 0}
		}
	}
	if inTx {
		s.Recheck = true
	}
	s.Unverified = false
	s.Gen++
}

// ReadFailedLocked records a pg_locks read that failed: noBlock (the
// server said no transaction block is open, SQLSTATE 25P01) means the
// block the state believed open by text is not; otherwise, inside a
// transaction (the read aborted with it), the read is made again once the
// transaction ends.
func (s *State[K]) ReadFailedLocked(noBlock, inTx bool) {
	if noBlock {
		s.TextTx = false
	} else if inTx {
		s.Recheck = true
	}
}
