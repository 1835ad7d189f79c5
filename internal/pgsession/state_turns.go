package pgsession

import "github.com/lockhooks/lockhooks/internal/advisorykey"

// The turns a connection owns in its database's in-process queue of lock
// statements per key: it owns a key's turn from its lock statement until
// it no longer holds the key (unlock, a rerouted unlock, a loss, its
// close). The queue itself is the caller's; a State only says which turns
// are the connection's and which it gives up.

// OwnsTurn reports whether the connection owns key's turn.
func (s *State[K]) OwnsTurn(key int64) bool {
	s.mu.Lock()
	_, owned := s.Turns[key]
	s.mu.Unlock()
	return owned
}

// NotePendingTurn records that the connection took key's turn for a
// statement whose outcome is not settled yet.
func (s *State[K]) NotePendingTurn(key int64) {
	s.mu.Lock()
	s.PendingTurn, s.HasPendingTurn = key, true
	s.mu.Unlock()
}

// SettlePendingTurnLocked makes the turn taken for the last lock
// statement (NotePendingTurn) one the connection owns, and reports
// whether there was one: the caller then gives up those it no longer
// needs (ReleaseTurnsLocked), the statement having failed or been
// cancelled before the grant.
func (s *State[K]) SettlePendingTurnLocked() bool {
	if !s.HasPendingTurn {
		return false
	}
	s.HasPendingTurn = false
	s.AdoptTurnLocked(s.PendingTurn)
	return true
}

// AdoptTurnLocked records that the connection owns key's turn.
func (s *State[K]) AdoptTurnLocked(key int64) {
	if s.Turns == nil {
		s.Turns = make(map[int64]struct{})
	}
	s.Turns[key] = struct{}{}
}

// ReleaseTurnsLocked gives up the turns of keys the connection no longer
// holds (all of them once it is closed), calling release for each as it
// forgets it; release may take the turn table's mutex, a leaf. While what
// the backend holds is unknown (Unverified), the connection keeps its
// turns: the server may hold the key.
func (s *State[K]) ReleaseTurnsLocked(release func(key int64)) {
	if s.Unverified && !s.Closed {
		return
	}
	for key := range s.Turns {
		if s.Closed || s.Held[K(advisorykey.Key{K1: key})] == nil {
			delete(s.Turns, key)
			release(key)
		}
	}
}

// AwaitsOnServer reports whether the connection owns key's turn for a
// lock statement that waits on the server (pending, in flight).
func (s *State[K]) AwaitsOnServer(key int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.AwaitsOnServerLocked(key)
}

// AwaitsOnServerLocked is AwaitsOnServer with the mutex held.
func (s *State[K]) AwaitsOnServerLocked(key int64) bool {
	return s.HasPendingTurn && s.PendingTurn == key && s.Busy > 0
}
