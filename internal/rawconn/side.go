package rawconn

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync"
)

// ErrSideClosed is the error of a Side's use after its Close.
var ErrSideClosed = errors.New("lockhooks: the database is closed: no side connection for lookups")

// Side is a database's one connection outside its pool for lockhooks' own
// reads of the server: opened when first needed, shared by every use in
// turn (a caller waits for it until its context ends), closed and opened
// again after a failure that may have left it unusable, and closed by
// Close. However many lookups run at once, the database has this one.
type Side struct {
	connect func(context.Context) (driver.Conn, error)
	turn    chan struct{} // holds a token while someone uses conn
	base    context.Context
	stop    context.CancelFunc // ends base: reads in flight at Close

	mu     sync.Mutex
	conn   driver.Conn // guarded by turn; nil: not open
	closed bool        // guarded by mu
}

// NewSide returns the side connection of a database whose connections
// connect opens; nothing is opened yet.
func NewSide(connect func(context.Context) (driver.Conn, error)) *Side {
	base, stop := context.WithCancel(context.Background())
	return &Side{connect: connect, turn: make(chan struct{}, 1), base: base, stop: stop}
}

// Context is ended by Close: the context of reads made on the side
// connection for others than their caller (shared reads), which only
// Close should stop.
func (s *Side) Context() context.Context { return s.base }

// Use runs fn on the side connection when its turn comes, opening the
// connection if needed. fn must be done with the connection when it
// returns (its rows closed). After any failure (or a connection its driver
// says is no longer valid) the connection is closed and the next use opens
// another: a read cut off by its context, or a transaction fn left open,
// never reaches the next user. A failure on a connection kept from an
// earlier use (the server ended it: idle_session_timeout, a restart) is
// tried once more on a fresh one.
func (s *Side) Use(ctx context.Context, fn func(driver.Conn) error) error {
	select {
	case s.turn <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("lockhooks: waiting for the side connection of lookups (in use by another lookup): %w", ctx.Err())
	}
	defer s.release()
	if s.isClosed() {
		return ErrSideClosed
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

// release ends a turn; after Close, the last user closes the connection.
func (s *Side) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed && s.conn != nil {
		s.conn.Close()
		s.conn = nil
	}
	<-s.turn
}

func (s *Side) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// Close ends reads in flight and closes the connection: now if nobody
// uses it, or when its user is done (without waiting for it).
func (s *Side) Close() {
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
