package pgsession

import (
	"sync"
	"sync/atomic"
	"time"
)

// monoBase is the origin of monoNow's readings (set once, never changed).
var monoBase = time.Now()

// monoNow reads the monotonic clock, in a form an atomic holds.
func monoNow() int64 { return int64(time.Since(monoBase)) }

// RoundTrips is when a connection last sent a statement that lockhooks
// follows and when one was last answered, for ending its backend after a
// loss only if nobody else can have run on it since ([RoundTrips.Target]).
// The connection's goroutine notes its round trips; the monitor and the
// loss path read them, from other goroutines. Its mutex is a leaf.
type RoundTrips struct {
	sentAt, answeredAt atomic.Int64 // monoNow readings
	mu                 sync.Mutex
	sentText           string // the text sentAt's statement carried
}

// Sent records that the connection is sending a statement to its backend,
// with its text ("" when it need not be recognised: an end request never
// trusts an unanswered statement it cannot recognise).
func (r *RoundTrips) Sent(text string) {
	r.mu.Lock()
	r.sentText = text
	r.mu.Unlock()
	r.sentAt.Store(monoNow())
}

// Answered records that the connection's backend answered it.
func (r *RoundTrips) Answered() { r.answeredAt.Store(monoNow()) }

// Target is the end request's target for backend pid (its incarnation,
// IncarnationExpr's reading: "" when not known), as of now. Its Quiet is
// the time after which the backend can have started no statement of the
// connection's: when its last statement was sent, plus EndSlack (the time
// it may take to get there), or when it was answered if that came sooner,
// or, if it was never answered (the connection broke with it on the way,
// or waiting), when the one before it was answered, with the unanswered
// one recognised by its text within its slack. Never when an answer came
// back: on a slow link that is a round trip after the server finished,
// time in which a pooler could already have given the backend to another
// client. Statements the caller does not note (those of a connection
// holding no locks, a transaction's BEGIN and COMMIT) are not counted: a
// backend whose last statement was one is not ended, and keeps its locks
// until the server notices its connection is gone.
func (r *RoundTrips) Target(pid int32, incarnation string) EndTarget {
	sent, answered := r.sentAt.Load(), r.answeredAt.Load()
	t := EndTarget{PID: pid, Incarnation: incarnation, Quiet: monoBase.Add(min(time.Duration(sent)+EndSlack, time.Duration(answered)))}
	if answered < sent {
		t.Quiet = monoBase.Add(time.Duration(answered))
		r.mu.Lock()
		text := r.sentText
		r.mu.Unlock()
		t.InFlight, t.SentQuiet, t.Sent = true, monoBase.Add(time.Duration(sent)+EndSlack), text
	}
	return t
}
