package pgsession

import (
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
	"github.com/lockhooks/lockhooks/internal/callsite"
)

// Key is what a State is keyed by: [advisorykey.Key], or a type defined
// over it (the root's, which formats a key by the name it was made from),
// so a State converts its keys to [advisorykey.Key] and back for free.
type Key interface{ advisorykey.Typed }

// Held is one session lock a connection holds.
type Held struct {
	Count int // re-entrant acquisitions (Postgres stacks them)
	// Approx: Count may be off, because a statement lockhooks could not
	// read ran while the key was held (pg_locks shows no counts); the next
	// statement on the key is checked against pg_locks.
	Approx bool
	Since  time.Time
	Site   string            // where it was taken: file:line
	Span   trace.SpanContext // the span of the statement that took it
}

// State is what a connection knows of its advisory locks: a cache of
// pg_locks for its backend, kept exact where statement text tells the
// effect and refreshed from pg_locks where it does not.
//
// Its fields are guarded by its mutex (Lock, Unlock), Active excepted;
// the methods named ...Locked are called with it held, the others take
// it themselves. Under it the caller takes only leaves: the in-process
// turn table's mutex (when a turn is handed over, and through
// ReleaseTurnsLocked's release) and the telemetry the freed callbacks
// record a hold in.
type State[K Key] struct {
	// Active: the connection holds session locks, lost them, or is in a
	// transaction block lockhooks follows: its statements take the slow
	// path.
	Active atomic.Bool

	mu   sync.Mutex
	Held map[K]*Held // session locks
	Xact map[K]int   // transaction-level locks of the current transaction, as taken by this connection
	// When and where the transaction took its first transaction-level
	// lock, for /debug/locks (Xact is empty: unset).
	XactSince time.Time
	XactSite  string
	XactPCs   callsite.Stack // when XactSite is "": symbolised only when shown
	TextTx    bool           // in a transaction block opened by statement text (BEGIN), not by database/sql
	Parked    bool           // withdrawn from the pool; owned by the pinning registry
	ParkedAt  time.Time
	Closed    bool // the physical connection was closed by lockhooks
	Warned    bool
	Lost      error         // non-nil once the locks are known lost
	LostCh    chan struct{} // closed when Lost is set
	Gen       uint64        // changes whenever Held may have changed
	Busy      int           // advisory statements in flight
	Recheck   bool          // read pg_locks again once the transaction ends
	// Unverified: the pg_locks read that must follow a failed lock
	// statement failed, so what the backend holds is unknown: the next
	// statement reads it first, and a return to the pool reads it or
	// closes the connection.
	Unverified bool
	EverHeld   bool  // has held a session lock (a session-pinning pooler keeps it pinned)
	PinnedTo   int32 // a session-pinning pooler: the backend pg_locks found its session locks on

	// Turns are the keys whose turn in the database's in-process queue
	// the connection owns; PendingTurn is the one it took for a lock
	// statement not yet settled (HasPendingTurn).
	Turns          map[int64]struct{}
	PendingTurn    int64
	HasPendingTurn bool
}

// TookLocked reports where and when the connection took the session lock
// of k (k's mode exactly), if it holds it (holding.Locks).
func (s *State[K]) TookLocked(k K) (site string, since time.Time, span trace.SpanContext, ok bool) {
	l := s.Held[k]
	if l == nil {
		return "", time.Time{}, trace.SpanContext{}, false
	}
	return l.Site, l.Since, l.Span, true
}

// HoldsXactLocked reports whether the current transaction holds k (k's
// mode exactly) at transaction level (holding.Locks).
func (s *State[K]) HoldsXactLocked(k K) bool { return s.Xact[k] > 0 }

// Lock locks the state's mutex.
func (s *State[K]) Lock() { s.mu.Lock() }

// Unlock unlocks the state's mutex.
func (s *State[K]) Unlock() { s.mu.Unlock() }

// UpdateActiveLocked recomputes whether statements need the slow path
// (Active), and reports whether the connection owns turns, some of which
// it may have to give up now (ReleaseTurnsLocked).
func (s *State[K]) UpdateActiveLocked() (ownsTurns bool) {
	if len(s.Held) > 0 {
		s.EverHeld = true
	}
	s.Active.Store(len(s.Held) > 0 || s.Lost != nil || s.TextTx || s.Recheck || s.Unverified || len(s.Xact) > 0)
	return len(s.Turns) > 0
}

// Holds reports whether the connection holds the session lock k.
func (s *State[K]) Holds(k K) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.Held[k] != nil
}

// TryCertainLocked reports whether a try-lock of k on this connection
// certainly succeeds: the backend already holds k in that mode, or holds
// it exclusively (a backend's own locks never conflict with its requests,
// and nobody else can hold a key it holds exclusively).
func (s *State[K]) TryCertainLocked(k K) bool {
	x := advisorykey.Exclusive(k)
	return s.Held[k] != nil || s.Held[x] != nil || s.Xact[k] > 0 || s.Xact[x] > 0
}

// OldestLocked returns the session lock held longest and its key,
// leaving out the lock of key skip (if not nil); nil when no other is
// held. s is locked.
func (s *State[K]) OldestLocked(skip *K) (key K, oldest *Held) {
	for k, l := range s.Held {
		if skip != nil && k == *skip {
			continue
		}
		if oldest == nil || l.Since.Before(oldest.Since) {
			key, oldest = k, l
		}
	}
	return key, oldest
}

// CoreKeys returns keys as the core's key values.
func CoreKeys[K Key](keys []K) []advisorykey.Key {
	out := make([]advisorykey.Key, len(keys))
	for i, k := range keys {
		out[i] = advisorykey.Key(k)
	}
	return out
}

// shared returns k in shared mode.
func shared[K Key](k K) K { return K(advisorykey.Key(k).SharedMode()) }

// AddLocked records n more acquisitions of k, taken at site in span (the
// first one's are kept).
func (s *State[K]) AddLocked(k K, site string, span trace.SpanContext, n int) {
	if s.Held == nil {
		s.Held = make(map[K]*Held)
	}
	l := s.Held[k]
	if l == nil {
		l = &Held{Since: time.Now(), Site: site, Span: span}
		s.Held[k] = l
	}
	l.Count += n
}

// ForgetLocked records one release of k. It reports the lock's Since when
// that release was its last (the connection holds k no more), for the
// hold-time metric.
func (s *State[K]) ForgetLocked(k K) (since time.Time, freed bool) {
	if l := s.Held[k]; l != nil {
		if l.Count--; l.Count <= 0 {
			delete(s.Held, k)
			return l.Since, true
		}
	}
	return time.Time{}, false
}

// ForgetAllLocked records pg_advisory_unlock_all: each session lock is
// forgotten, freed told its Since (for the hold-time metric) as it goes.
func (s *State[K]) ForgetAllLocked(freed func(since time.Time)) {
	for k, l := range s.Held {
		freed(l.Since)
		delete(s.Held, k)
	}
}

// ClearLocked records that the connection holds no session lock (DISCARD
// ALL), freed told each one's Since first; Gen changes.
func (s *State[K]) ClearLocked(freed func(since time.Time)) {
	for _, l := range s.Held {
		freed(l.Since)
	}
	s.Held = nil
	s.Gen++
}

// AddXactLocked records one transaction-level acquisition of k by a
// statement at site; the transaction's first one sets when and where.
func (s *State[K]) AddXactLocked(k K, site string) {
	if s.Xact == nil {
		s.Xact = make(map[K]int)
		s.XactSince, s.XactSite = time.Now(), site
		s.XactPCs.Reset()
	}
	s.Xact[k]++
}

// AddXactKeysLocked records transaction-level bigint keys taken by
// lockhooks' own statements at the call site stack site (Lock on
// Postgres), symbolised only when shown.
func (s *State[K]) AddXactKeysLocked(keys []int64, site *callsite.Stack) {
	if s.Xact == nil {
		s.Xact = make(map[K]int)
		s.XactSince, s.XactSite, s.XactPCs = time.Now(), "", *site
	}
	for _, k := range keys {
		s.Xact[K(advisorykey.Key{K1: k})]++
	}
}

// EndTransactionLocked forgets the transaction-level locks of the
// transaction that just ended, and reports whether a statement in it
// changed session locks in ways only pg_locks can tell (Recheck, which
// it clears): the caller reads pg_locks then.
func (s *State[K]) EndTransactionLocked() (recheck bool) {
	s.Xact = nil
	recheck = s.Recheck
	s.Recheck = false
	return recheck
}

// Park marks the connection withdrawn from the pool for its session
// locks, at now; false if it holds none or they are lost.
func (s *State[K]) Park(now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.Held) == 0 || s.Lost != nil {
		return false
	}
	s.Parked, s.ParkedAt = true, now
	return true
}

// MustStayOut reports whether the connection must stay out of the pool:
// it holds session locks, or lost them.
func (s *State[K]) MustStayOut() bool {
	if !s.Active.Load() {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.Held) > 0 || s.Lost != nil
}
