package pgblocking

import (
	"context"
	"database/sql/driver"
	"fmt"
	"sync"
	"time"

	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/pgdriver"
	"github.com/lockhooks/lockhooks/internal/rawconn"
)

// Conn is one connection of the database as the reads match backends to
// it: the caller's own connection type (a pointer).
type Conn interface {
	comparable
	// ID is the connection's number in its database, as its published
	// identity names it.
	ID() uint64
	// PID is the backend the connection met at connect (0 until known).
	PID() int32
	// HolderPID is the backend of the holder connection it keeps through
	// a transaction pooler (0 when none).
	HolderPID() int32
	// ConnectApp is its application_name at connect.
	ConnectApp() string
}

// Config is what a [Reader] needs of its database.
type Config[C Conn] struct {
	// Side is the database's one connection outside its pool for
	// lockhooks' reads; the reads never open another.
	Side *rawconn.Side
	// Own is what the driver allows lockhooks' own statements (the read's
	// arguments, and whether connections publish their identity).
	Own *pgdriver.Statements
	// Database returns the database's number in this process, as
	// identities name it (set when the database joins the process's
	// registry, after the reader is made).
	Database func() uint64
	// TxPooler: a transaction pooler is declared, so the backend a
	// connection met at connect serves other clients.
	TxPooler bool
	// PoolerSeen reports whether a transaction pooler was seen (as if
	// declared, from then on); nil: never.
	PoolerSeen func() bool
	// Conns returns the database's open connections.
	Conns func() []C
	// SeenBy is the database as the blockers read name it
	// (holders.Blocker.SeenBy).
	SeenBy any
	// Timeout bounds each read of who blocks whom.
	Timeout time.Duration
}

// Reader reads who blocks whom among one database's connections, sharing
// the reads that overlap.
type Reader[C Conn] struct {
	cfg Config[C]

	mu     sync.Mutex // guards flight
	flight *flight[C] // the read in flight, if any
}

// New returns the reader of the database cfg describes.
func New[C Conn](cfg Config[C]) *Reader[C] { return &Reader[C]{cfg: cfg} }

// Wait is what Postgres says of one of the database's connections that
// waits on the server.
type Wait struct {
	PID         int32             // the backend that waits (through a pooler, not the one the connection met at connect)
	WaitEvent   string            // wait_event_type/wait_event
	Query       string            // its statement
	WaitSeconds float64           // how long its statement has run (it waits in it); -1: unknown
	Blockers    []holders.Blocker // by depth: who blocks it, and whom those wait for, to the root (at most pgserver.MaxQueuedListed of them waiting)
	QueuedAhead int               // how many backends block it directly while waiting themselves (queued ahead of it), listed or not
}

// BehindInMemory is what a connection that waits in memory behind w's
// connection (for the turn of the key w's connection waits for on the
// server) waits for: the same holders, with w's connection queued ahead
// too.
func (w *Wait) BehindInMemory() *Wait {
	x := *w
	x.QueuedAhead++
	x.PID, x.WaitEvent = 0, "" // it does not wait on the server itself
	return &x
}

// flight is one read of who blocks whom that every caller arriving while
// it runs shares, when it covers their connections.
type flight[C Conn] struct {
	done   chan struct{}
	covers map[C]bool // the connections it reads
	out    map[C]*Wait
	err    error
}

// coversAll reports whether f reads every connection of conns.
func (f *flight[C]) coversAll(conns []C) bool {
	for _, oc := range conns {
		if !f.covers[oc] {
			return false
		}
	}
	return true
}

// Blocked reads which of conns wait on the server and for whom, in one
// query on the database's side connection (never a pool's). A connection
// is matched to the backend that runs its statement by the identity it
// published (a transaction through a pooler runs on any backend), or, on
// a connection that publishes none, by the backend pid it met at connect,
// unless a pooler is declared or seen (that backend serves other clients)
// or the backend shows another application_name than the connection had
// (an undeclared pooler gave it to another client). Connections that wait
// for nothing are absent.
//
// Reads that overlap share one: the read in flight when it covers conns,
// or a new one over all the database's open connections and conns. The
// read is bounded by the configured timeout and the side connection's
// close, not by ctx (others share it); a caller whose ctx ends stops
// waiting for it.
func (r *Reader[C]) Blocked(ctx context.Context, conns []C) (map[C]*Wait, error) {
	if len(conns) == 0 {
		return nil, nil
	}
	all, err := r.sharedRead(ctx, conns)
	if err != nil {
		return nil, err
	}
	out := make(map[C]*Wait, min(len(conns), len(all)))
	for _, oc := range conns {
		if w := all[oc]; w != nil {
			out[oc] = w
		}
	}
	return out, nil
}

// sharedRead returns who blocks whom among the open connections and
// conns (Blocked).
func (r *Reader[C]) sharedRead(ctx context.Context, conns []C) (map[C]*Wait, error) {
	r.mu.Lock()
	f := r.flight
	if f == nil || !f.coversAll(conns) {
		all := r.cfg.Conns()
		f = &flight[C]{done: make(chan struct{}), covers: make(map[C]bool, len(all)+len(conns))}
		for _, oc := range all {
			f.covers[oc] = true
		}
		for _, oc := range conns {
			if !f.covers[oc] {
				f.covers[oc] = true
				all = append(all, oc)
			}
		}
		r.flight = f
		go r.run(f, all)
	}
	r.mu.Unlock()
	select {
	case <-f.done:
		return f.out, f.err
	case <-ctx.Done():
		return nil, fmt.Errorf("lockhooks: reading pg_blocking_pids: %w", ctx.Err())
	}
}

// run makes the read of flight f over conns.
func (r *Reader[C]) run(f *flight[C], conns []C) {
	ctx, cancel := context.WithTimeout(r.cfg.Side.Context(), r.cfg.Timeout)
	defer cancel()
	f.err = r.cfg.Side.Use(ctx, func(side driver.Conn) error {
		var err error
		f.out, err = r.read(ctx, side, conns)
		return err
	})
	if f.err != nil {
		f.out = nil
	}
	r.mu.Lock()
	if r.flight == f {
		r.flight = nil
	}
	r.mu.Unlock()
	close(f.done)
}
