package lockhooks

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync"
)

// sideConnsPerDatabase is how many server connections outside its pool a
// Postgres database of lockhooks opens at most, each lazily and each closed
// by db.Close: one for the lookups (sideConn: the debug page, the
// slow-wait log, the wait spans, the errors of waits that time out,
// deadlock errors, the self-wait probe) and one for the monitor of session
// locks (pg_monitor.go), open only while a connection holds session locks.
// A database through a transaction pooler also keeps, per pooled
// connection that holds session locks, the holder connection those locks
// live on (pg_pooler.go): that one is part of the connection, not a side
// connection.
const sideConnsPerDatabase = 2

// errSideConnClosed is the error of a lookup after db.Close.
var errSideConnClosed = errors.New("lockhooks: the database is closed: no side connection for lookups")

// sideConn is a database's one connection outside its pool for lockhooks'
// own reads of the server (who blocks whom, who holds a key, the facts of
// a deadlock, the self-wait probe): opened when first needed, shared by
// every lookup in turn (a caller waits for it until its context ends),
// closed and opened again after a failure that may have left it unusable,
// and closed by db.Close. The debug page and the lookups never open a
// server connection of their own: however many run at once, the database
// has this one (sideConnsPerDatabase counts it with the monitor's).
//
// Reads of who blocks whom that overlap share one read (blockersFlight):
// sixty page loads at once make one or two reads, not sixty.
type sideConn struct {
	connect func(context.Context) (driver.Conn, error)
	turn    chan struct{} // holds a token while someone uses conn
	base    context.Context
	stop    context.CancelFunc // ends base: reads in flight at db.Close

	mu     sync.Mutex
	conn   driver.Conn // guarded by turn; nil: not open
	closed bool        // guarded by mu
	flight *blockersFlight
}

// newSideConn returns the side connection of a database whose connections
// connect opens; nothing is opened yet.
func newSideConn(connect func(context.Context) (driver.Conn, error)) *sideConn {
	base, stop := context.WithCancel(context.Background())
	return &sideConn{connect: connect, turn: make(chan struct{}, 1), base: base, stop: stop}
}

// use runs fn on the side connection when its turn comes, opening the
// connection if needed. fn must be done with the connection when it
// returns (its rows closed). After any failure (or a connection its driver
// says is no longer valid) the connection is closed and the next use opens
// another: a read cut off by its context, or a transaction fn left open,
// never reaches the next user. A failure on a connection kept from an
// earlier use (the server ended it: idle_session_timeout, a restart) is
// tried once more on a fresh one.
func (s *sideConn) use(ctx context.Context, fn func(driver.Conn) error) error {
	select {
	case s.turn <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("lockhooks: waiting for the side connection of lookups (in use by another lookup): %w", ctx.Err())
	}
	defer s.release()
	if s.isClosed() {
		return errSideConnClosed
	}
	for reused := s.conn != nil; ; reused = false {
		if s.conn == nil {
			conn, err := s.connect(ctx)
			if err != nil {
				return fmt.Errorf("lockhooks: opening the side connection for lookups: %w", err)
			}
			s.conn = conn
		}
		err := fn(s.conn)
		if err == nil && valid(s.conn) {
			return nil
		}
		// A failure may leave the connection anywhere (mid-read, in a
		// transaction of the lookup's, cut off by ctx): a fresh one is
		// cheaper than finding out.
		s.conn.Close()
		s.conn = nil
		if err == nil || !reused || ctx.Err() != nil {
			return err
		}
	}
}

// valid reports whether conn may be used again, as far as its driver says.
func valid(conn driver.Conn) bool {
	v, ok := conn.(driver.Validator)
	return !ok || v.IsValid()
}

// release ends a turn; after close, the last user closes the connection.
func (s *sideConn) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed && s.conn != nil {
		s.conn.Close()
		s.conn = nil
	}
	<-s.turn
}

func (s *sideConn) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// close ends reads in flight and closes the connection: now if nobody
// uses it, or when its user is done (without waiting for it).
func (s *sideConn) close() {
	s.stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	select {
	case s.turn <- struct{}{}:
		if s.conn != nil {
			s.conn.Close()
			s.conn = nil
		}
		<-s.turn
	default: // in use: release closes it
	}
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
	ctx, cancel := context.WithTimeout(s.base, blockerLookupTimeout)
	defer cancel()
	f.err = s.use(ctx, func(side driver.Conn) error {
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
