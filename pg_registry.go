package lockhooks

import (
	"context"
	"database/sql/driver"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/lockhooks/lockhooks/internal/pgsession"
)

// The pinning registry: the connections that hold session locks, in use
// or parked, and their monitor (pgsession.Registry); the AdvisoryLocks
// handed out; db.Close; and the connection as the registry's member.

// pinning is the advisory-lock state of one wrapped Postgres database: the
// registry of the connections holding session locks (in use or parked)
// and its monitor, in internal/pgsession, and the AdvisoryLocks handed
// out, which only the database/sql adapter knows.
//
// Lock order: the registry's mutex, then a connection's pin.Exec, then its
// pin's mutex (pgsession.State's, c.pin.Lock); locksMu is a leaf. Code
// holding a pin's mutex never calls into pinning; code holding the
// registry's mutex never takes a pin.Exec. The end queue's mutex and the
// in-process turn table's are leaves: taken under any of these, nothing is
// taken under them.
type pinning struct {
	*pgsession.Registry[lockKey, *conn]
	c       *connector
	holders pgsession.TxPooler // what its connections' holders share through a declared transaction pooler

	locksMu     sync.Mutex
	locks       map[*AdvisoryLock]struct{} // handed out and not released
	locksClosed bool                       // db.Close has run: track refuses

	guard pgsession.PoolGuard[lockKey, *conn] // gives a lock statement's wait for its turn up when the pool deadlocks (internal/pgstmt's turns.go)
}

func newPinning(c *connector) *pinning {
	o := c.opts
	connect := func(ctx context.Context) (driver.Conn, error) { return c.inner.Connect(ctx) }
	p := &pinning{c: c, locks: make(map[*AdvisoryLock]struct{}),
		Registry: pgsession.NewRegistry[lockKey](pgsession.Config[*conn]{
			Settings: pgsession.Settings{CheckTimeout: o.lockCheckTimeout, TxPooler: o.txPooler, PinningPooler: o.pinningPooler,
				Logger: o.logger, Own: &c.own},
			CheckInterval: o.lockCheckInterval, ParkedWarning: o.parkedWarning,
			Connect:  connect,
			OpenConn: c.ConnByID,
			LongHold: func(msg string) { c.Events.Add(eventLongHold, msg) },
		})}
	p.holders = pgsession.TxPooler{Settings: p.Settings(), Connect: connect, Closing: p.Closing()}
	p.guard = p.poolGuard()
	return p
}

// track notes an AdvisoryLock handed out, for db.Close; false once
// db.Close has run.
func (p *pinning) track(l *AdvisoryLock) bool {
	p.locksMu.Lock()
	defer p.locksMu.Unlock()
	if p.locksClosed {
		return false
	}
	p.locks[l] = struct{}{}
	return true
}

// untrack forgets a released AdvisoryLock.
func (p *pinning) untrack(l *AdvisoryLock) {
	p.locksMu.Lock()
	delete(p.locks, l)
	p.locksMu.Unlock()
}

// Close is called by db.Close: every connection lockhooks kept for its
// locks is closed, which releases them on the server: parked ones at once
// (pgsession.Registry.Close, which this shadows), those of AdvisoryLocks
// through their *sql.Conn; a *sql.Conn the application still holds is
// closed by database/sql when it is returned, and its locks are reported
// lost now. One log line says what was released.
func (p *pinning) Close() {
	p.locksMu.Lock()
	p.locksClosed = true // from here on track refuses, as before db.Close looks at the holders
	p.locksMu.Unlock()
	released := p.Registry.Close()
	p.locksMu.Lock()
	locks := slices.Collect(maps.Keys(p.locks))
	p.locksMu.Unlock()
	for _, l := range locks {
		l.conn.Close() // database/sql closes it: the database is closed
		l.freeTurn()
	}
	if len(released) > 0 {
		sort.Strings(released)
		p.c.opts.logger.Warn("lockhooks: db.Close releases session advisory locks still held: "+strings.Join(released, "; "),
			"locks", len(released))
	}
}

// The connection as a member of its database's registry
// (pgsession.Member).

// Session returns c's state of its advisory locks.
func (c *conn) Session() *pgsession.State[lockKey] { return &c.pin.State }

// ID is c's number in its database.
func (c *conn) ID() uint64 { return c.id }

// PID is c's backend pid, 0 until known.
func (c *conn) PID() int32 { return c.pin.PID.Load() }

// Acquiring reports whether an AdvisoryLock's acquisition runs on c.
func (c *conn) Acquiring() bool { return c.acquiring.Load() }

// CloseInner closes the physical connection once, after whatever
// lockhooks runs on it.
func (c *conn) CloseInner() error {
	c.pin.Exec.Lock()
	defer c.pin.Exec.Unlock()
	c.pin.Lock()
	if c.pin.Closed {
		c.pin.Unlock()
		return nil
	}
	c.pin.Closed = true
	c.releaseTurnsLocked()
	c.pin.Unlock()
	c.connector.Closed(c)
	c.pin.Hold.Shut()
	return c.inner.Close()
}

// park withdraws c, which holds session locks, instead of closing it.
func (c *conn) park() bool {
	if c.connector.pins.IsClosed() {
		return false
	}
	return c.pin.Park(time.Now())
}

// holdsLocks reports whether c must stay out of the pool.
func (c *conn) holdsLocks() bool { return c.pin.MustStayOut() }
