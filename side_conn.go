package lockhooks

import (
	"context"
	"database/sql/driver"
	"fmt"
	"sync"

	"github.com/lockhooks/lockhooks/internal/rawconn"
)

// sideConnsPerDatabase is how many server connections outside its pool a
// Postgres database of lockhooks opens at most, each lazily and each closed
// by db.Close: one for the lookups (rawconn.Side: the debug page, the
// slow-wait log, the wait spans, the errors of waits that time out,
// deadlock errors, the self-wait probe) and one for the monitor of session
// locks (pg_monitor.go), open only while a connection holds session locks.
// A database through a transaction pooler also keeps, per pooled
// connection that holds session locks, the holder connection those locks
// live on (pg_pooler.go): that one is part of the connection, not a side
// connection.
const sideConnsPerDatabase = 2

// sideConn is a database's one connection outside its pool for lockhooks'
// own reads of the server (who blocks whom, who holds a key, the facts of
// a deadlock, the self-wait probe: rawconn.Side), and the read of who
// blocks whom in flight on it. The debug page and the lookups never open a
// server connection of their own (sideConnsPerDatabase counts this one
// with the monitor's).
//
// Reads of who blocks whom that overlap share one read (blockersFlight):
// sixty page loads at once make one or two reads, not sixty.
type sideConn struct {
	*rawconn.Side

	mu     sync.Mutex      // guards flight
	flight *blockersFlight // the read of who blocks whom in flight, if any
}

// newSideConn returns the side connection of a database whose connections
// connect opens; nothing is opened yet.
func newSideConn(connect func(context.Context) (driver.Conn, error)) *sideConn {
	return &sideConn{Side: rawconn.NewSide(connect)}
}

// blockersFlight is one read of who blocks whom that every caller
// arriving while it runs shares, when it covers their connections.
type blockersFlight struct {
	done   chan struct{}
	covers map[*conn]bool // the connections it reads
	out    map[*conn]*blockedBackend
	err    error
}

// coversAll reports whether f reads every connection of conns.
func (f *blockersFlight) coversAll(conns []*conn) bool {
	for _, oc := range conns {
		if !f.covers[oc] {
			return false
		}
	}
	return true
}

// sharedRead returns who blocks whom among the open connections of c
// (and conns): the read in flight when it covers conns, or a new one over
// all of them, on the side connection. The read is bounded by
// blockerLookupTimeout and db.Close, not by ctx (others share it); a
// caller whose ctx ends stops waiting for it.
func (s *sideConn) sharedRead(ctx context.Context, c *connector, conns []*conn) (map[*conn]*blockedBackend, error) {
	s.mu.Lock()
	f := s.flight
	if f == nil || !f.coversAll(conns) {
		all := c.openConns()
		f = &blockersFlight{done: make(chan struct{}), covers: make(map[*conn]bool, len(all)+len(conns))}
		for _, oc := range all {
			f.covers[oc] = true
		}
		for _, oc := range conns {
			if !f.covers[oc] {
				f.covers[oc] = true
				all = append(all, oc)
			}
		}
		s.flight = f
		go s.run(c, f, all)
	}
	s.mu.Unlock()
	select {
	case <-f.done:
		return f.out, f.err
	case <-ctx.Done():
		return nil, fmt.Errorf("lockhooks: reading pg_blocking_pids: %w", ctx.Err())
	}
}

// run makes the read of flight f over conns.
func (s *sideConn) run(c *connector, f *blockersFlight, conns []*conn) {
	ctx, cancel := context.WithTimeout(s.Context(), blockerLookupTimeout)
	defer cancel()
	f.err = s.Use(ctx, func(side driver.Conn) error {
		var err error
		f.out, err = c.readBlocked(ctx, side, conns)
		return err
	})
	if f.err != nil {
		f.out = nil
	}
	s.mu.Lock()
	if s.flight == f {
		s.flight = nil
	}
	s.mu.Unlock()
	close(f.done)
}
