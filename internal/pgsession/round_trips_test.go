package pgsession

import (
	"testing"
	"time"
)

// The target's quiet time follows the connection's round trips: the
// answer, or the sending plus EndSlack, whichever came first; an
// unanswered statement is in flight, recognised by its text within its
// slack, and the quiet time is the answer before it.
func TestRoundTripsTarget(t *testing.T) {
	var r RoundTrips
	r.Sent("SELECT pg_advisory_lock(1)")
	sent := time.Now()
	r.Answered()
	answered := time.Now()
	got := r.Target(42, "1@2")
	if got.PID != 42 || got.Incarnation != "1@2" || got.InFlight {
		t.Fatalf("an answered statement: %+v", got)
	}
	if got.Quiet.After(answered) || got.Quiet.After(sent.Add(EndSlack)) {
		t.Errorf("quiet %v is later than the answer (%v) or the sending plus its slack", got.Quiet, answered)
	}

	before := got.Quiet
	r.Sent("SELECT pg_advisory_lock(2)")
	inFlight := r.Target(42, "1@2")
	if !inFlight.InFlight || inFlight.Sent != "SELECT pg_advisory_lock(2)" || !inFlight.Quiet.Equal(before) {
		t.Fatalf("an unanswered statement: %+v, want it in flight, quiet still %v", inFlight, before)
	}
	if inFlight.SentQuiet.Before(inFlight.Quiet.Add(EndSlack)) {
		t.Errorf("the statement in flight may start until %v, before its sending plus EndSlack", inFlight.SentQuiet)
	}
}
