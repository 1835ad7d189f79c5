package pgsession

import (
	"database/sql/driver"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/lockhooks/lockhooks/internal/sqlscan"
)

// ApplyLocked records the effect of an advisory statement that is a
// target list whose keys are all known (keys[i] is calls[i]'s), call by
// call, left to right. results[i] is call i's answer where the statement
// returned one (a try-lock's bool); inTx says whether the connection is
// in a transaction block (a transaction-level lock outside one ends with
// the statement); site and span are where the statement ran; freed is
// told when each session lock released was taken, for the hold-time
// metric. A try-lock whose answer is missing is certain only where the
// connection already holds the key; the others are returned, for a read
// of pg_locks to tell (pending: +1 per session try-lock, -1 per
// transaction-level one). Gen changes; the caller recomputes Active. s is
// locked.
func (s *State[K]) ApplyLocked(calls []sqlscan.AdvisoryCall, keys []K, results []driver.Value, inTx bool, site string, span trace.SpanContext, freed func(since time.Time)) (pending map[K]int) {
	for i, call := range calls {
		k := keys[i]
		fn := call.Func
		if fn&sqlscan.FnTry != 0 {
			var got, sure bool
			if i < len(results) {
				got, sure = results[i].(bool)
			}
			if !sure && s.TryCertainLocked(k) {
				got, sure = true, true
			}
			if !sure {
				if pending == nil {
					pending = map[K]int{}
				}
				if fn&sqlscan.FnXact != 0 {
					pending[k]--
				} else {
					pending[k]++
				}
				continue
			}
			if !got {
				continue
			}
		}
		switch {
		case fn&sqlscan.FnUnlockAll != 0:
			s.ForgetAllLocked(freed)
		case fn&sqlscan.FnXact != 0:
			if inTx {
				s.AddXactLocked(k, site)
			}
		case fn&sqlscan.FnUnlock != 0:
			if since, ok := s.ForgetLocked(k); ok {
				freed(since)
			}
		default:
			s.AddLocked(k, site, span, 1)
		}
	}
	s.Gen++
	return pending
}

// UnheldUnlocksLocked returns the keys of a statement of several calls
// whose unlocks find the key not held at that point, call by call, left
// to right (keys[i] is calls[i]'s): what another connection may hold, or
// Postgres answers false for. The count of a key goes below 0 where
// Postgres's stays at 0, so an unlock after a failed unlock and a lock of
// the same key is named too. s is locked.
func (s *State[K]) UnheldUnlocksLocked(calls []sqlscan.AdvisoryCall, keys []K) (unheld []K) {
	taken := map[K]int{}
	for k, l := range s.Held {
		taken[k] = l.Count
	}
	for i, call := range calls {
		k := keys[i]
		switch {
		case call.Func&sqlscan.FnUnlockAll != 0:
			clear(taken)
		case call.Func&sqlscan.FnXact != 0:
		case call.Func&sqlscan.FnUnlock != 0:
			if taken[k] <= 0 {
				unheld = append(unheld, k)
			}
			taken[k]--
		case call.Func&sqlscan.FnTry == 0:
			taken[k]++
		}
	}
	return unheld
}
