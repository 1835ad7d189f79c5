package pgsession

import (
	"errors"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
	"github.com/lockhooks/lockhooks/internal/callsite"
)

// A State keyed by advisorykey.Key itself compiles: the constraint is the
// key's own struct.
var _ State[advisorykey.Key]

// Grants stack, releases count down, and only the last release frees the
// key, with the first grant's time and site; a release of a key not held
// changes nothing.
func TestStateAddForget(t *testing.T) {
	var s State[advisorykey.Key]
	k := advisorykey.Key{K1: 42}
	s.Lock()
	defer s.Unlock()
	s.AddLocked(k, "a.go:1", noSpan, 1)
	first := s.Held[k].Since
	s.AddLocked(k, "b.go:2", noSpan, 2)
	if l := s.Held[k]; l.Count != 3 || l.Site != "a.go:1" || !l.Since.Equal(first) {
		t.Fatalf("after three grants: %+v, want count 3 from a.go:1", l)
	}
	for i := range 2 {
		if _, freed := s.ForgetLocked(k); freed {
			t.Fatalf("release %d freed the key while it was stacked", i+1)
		}
	}
	since, freed := s.ForgetLocked(k)
	if !freed || !since.Equal(first) || s.Held[k] != nil {
		t.Fatalf("last release: since %v freed %v, held %v; want the first grant's time, freed", since, freed, s.Held[k])
	}
	if _, freed := s.ForgetLocked(k); freed {
		t.Fatal("a release of a key not held freed it")
	}
}

// Active follows every reason for the slow path, and EverHeld stays once
// a session lock was held.
func TestStateActive(t *testing.T) {
	var s State[advisorykey.Key]
	s.Lock()
	defer s.Unlock()
	k := advisorykey.Key{K1: 1}
	if s.UpdateActiveLocked(); s.Active.Load() {
		t.Fatal("an empty state is active")
	}
	s.AddLocked(k, "", noSpan, 1)
	s.UpdateActiveLocked()
	if !s.Active.Load() || !s.EverHeld {
		t.Fatal("holding a session lock: not active, or EverHeld unset")
	}
	s.ForgetLocked(k)
	s.UpdateActiveLocked()
	if s.Active.Load() || !s.EverHeld {
		t.Fatal("after the release: still active, or EverHeld forgotten")
	}
	for name, set := range map[string]func(*State[advisorykey.Key]){
		"lost":       func(s *State[advisorykey.Key]) { s.Lost = errTest },
		"textTx":     func(s *State[advisorykey.Key]) { s.TextTx = true },
		"recheck":    func(s *State[advisorykey.Key]) { s.Recheck = true },
		"unverified": func(s *State[advisorykey.Key]) { s.Unverified = true },
		"xact":       func(s *State[advisorykey.Key]) { s.AddXactLocked(k, "") },
	} {
		var s State[advisorykey.Key]
		set(&s)
		if s.UpdateActiveLocked(); !s.Active.Load() {
			t.Errorf("%s: not active", name)
		}
	}
}

// A try-lock is certain where the backend holds the key in that mode or
// exclusively, at session or transaction level; a shared hold does not
// make an exclusive try certain.
func TestStateTryCertain(t *testing.T) {
	excl, shared := advisorykey.Key{K1: 7}, advisorykey.Key{K1: 7, Shared: true}
	var s State[advisorykey.Key]
	if s.TryCertainLocked(excl) || s.TryCertainLocked(shared) {
		t.Fatal("certain with nothing held")
	}
	s.AddLocked(shared, "", noSpan, 1)
	if !s.TryCertainLocked(shared) || s.TryCertainLocked(excl) {
		t.Fatal("holding it shared: want a shared try certain, an exclusive one not")
	}
	var x State[advisorykey.Key]
	x.AddXactLocked(excl, "")
	if !x.TryCertainLocked(shared) || !x.TryCertainLocked(excl) {
		t.Fatal("holding it exclusively for the transaction: want both tries certain")
	}
}

// The transaction's first transaction-level lock sets when and where;
// its end forgets them and hands over Recheck once.
func TestStateTransaction(t *testing.T) {
	var s State[advisorykey.Key]
	k := advisorykey.Key{K1: 3}
	s.AddXactLocked(k, "a.go:1")
	s.AddXactLocked(k, "b.go:2")
	if s.Xact[k] != 2 || s.XactSite != "a.go:1" || s.XactSince.IsZero() {
		t.Fatalf("xact %v at %q since %v; want 2 at a.go:1", s.Xact[k], s.XactSite, s.XactSince)
	}
	var site callsite.Stack
	s.AddXactKeysLocked([]int64{3, 4}, &site)
	if s.Xact[k] != 3 || s.Xact[advisorykey.Key{K1: 4}] != 1 || s.XactSite != "a.go:1" {
		t.Fatalf("after lockhooks' own keys: %v, site %q", s.Xact, s.XactSite)
	}
	s.Recheck = true
	if !s.EndTransactionLocked() || s.Xact != nil || s.Recheck {
		t.Fatal("the transaction's end: want recheck handed over once and the xact locks gone")
	}
	if s.EndTransactionLocked() {
		t.Fatal("recheck handed over twice")
	}
	var own State[advisorykey.Key]
	own.AddXactKeysLocked([]int64{5}, &site)
	if own.XactSite != "" || own.XactSince.IsZero() {
		t.Fatal("lockhooks' own first key: want no site text (the stack is kept) and a time")
	}
}

// pg_advisory_unlock_all forgets every session lock and reports each;
// DISCARD ALL does so too and changes Gen.
func TestStateForgetAllAndClear(t *testing.T) {
	var s State[advisorykey.Key]
	for i := range 3 {
		s.AddLocked(advisorykey.Key{K1: int64(i)}, "", noSpan, 1+i)
	}
	n := 0
	s.ForgetAllLocked(func(time.Time) { n++ })
	if n != 3 || len(s.Held) != 0 {
		t.Fatalf("unlock_all reported %d of 3, holds %d", n, len(s.Held))
	}
	s.AddLocked(advisorykey.Key{K1: 9}, "", noSpan, 1)
	gen := s.Gen
	n = 0
	s.ClearLocked(func(time.Time) { n++ })
	if n != 1 || s.Held != nil || s.Gen == gen {
		t.Fatalf("clear reported %d of 1, held %v, gen %d (was %d)", n, s.Held, s.Gen, gen)
	}
}

// Parking needs live session locks; a connection must stay out of the
// pool while it holds them or lost them.
func TestStatePark(t *testing.T) {
	var s State[advisorykey.Key]
	if s.Park(time.Now()) || s.MustStayOut() {
		t.Fatal("parked, or kept out, holding nothing")
	}
	s.Lock()
	s.AddLocked(advisorykey.Key{K1: 1}, "", noSpan, 1)
	s.UpdateActiveLocked()
	s.Unlock()
	if !s.MustStayOut() || !s.Park(time.Now()) || !s.Parked || s.ParkedAt.IsZero() {
		t.Fatal("holding a lock: want kept out and parked")
	}
	var lost State[advisorykey.Key]
	lost.Lock()
	lost.AddLocked(advisorykey.Key{K1: 1}, "", noSpan, 1)
	lost.Lost = errTest
	lost.UpdateActiveLocked()
	lost.Unlock()
	if lost.Park(time.Now()) || !lost.MustStayOut() {
		t.Fatal("lost: want not parked, kept out")
	}
}

// A turn taken for a statement becomes the connection's once settled; it
// is given back when the key is not held, kept while it is, kept by an
// unverified connection, and given back by a closed one whatever it
// holds.
func TestStateTurns(t *testing.T) {
	var s State[advisorykey.Key]
	s.NotePendingTurn(5)
	s.Busy = 1
	if !s.AwaitsOnServer(5) || s.AwaitsOnServer(6) {
		t.Fatal("a pending turn in flight: want it awaited on the server, no other")
	}
	s.Busy = 0
	s.Lock()
	defer s.Unlock()
	if !s.SettlePendingTurnLocked() || s.SettlePendingTurnLocked() {
		t.Fatal("settle: want the pending turn settled once")
	}
	if _, ok := s.Turns[5]; !ok {
		t.Fatal("the settled turn is not owned")
	}
	var released []int64
	release := func(key int64) { released = append(released, key) }
	s.AddLocked(advisorykey.Key{K1: 5}, "", noSpan, 1)
	if s.ReleaseTurnsLocked(release); len(released) != 0 {
		t.Fatalf("released %v while the key is held", released)
	}
	s.ForgetLocked(advisorykey.Key{K1: 5})
	s.Unverified = true
	if s.ReleaseTurnsLocked(release); len(released) != 0 {
		t.Fatalf("released %v while unverified", released)
	}
	s.Unverified = false
	if s.ReleaseTurnsLocked(release); len(released) != 1 || released[0] != 5 || len(s.Turns) != 0 {
		t.Fatalf("released %v (turns left %v); want [5]", released, s.Turns)
	}
	s.AdoptTurnLocked(8)
	s.AddLocked(advisorykey.Key{K1: 8}, "", noSpan, 1)
	s.Closed, s.Unverified = true, true
	if s.ReleaseTurnsLocked(release); len(released) != 2 || released[1] != 8 {
		t.Fatalf("closed: released %v; want 8 too", released)
	}
}

var (
	noSpan  trace.SpanContext
	errTest = errors.New("test")
)
