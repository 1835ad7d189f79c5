package lockhooks

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockhooks/lockhooks/internal/pgsession"
)

// The pinning registry: the connections that hold session locks, in use
// or parked, their closing, and db.Close.

// pinning is the advisory-lock state of one wrapped Postgres database: the
// connections holding session locks (in use or parked), the AdvisoryLocks
// handed out, and the monitor that checks holders are still alive.
//
// Lock order: pinning.mu, then a connection's pin.exec, then its pin's
// mutex (pgsession.State's, c.pin.Lock). Code holding a pin's mutex never
// calls into pinning; code holding pinning.mu never takes a pin.exec. The
// end queue's mutex and the in-process turn table's are leaves: taken
// under any of these, nothing is taken under them.
type pinning struct {
	c     *connector
	ends  *pgsession.EndQueue // backends of lost holders to end on the server
	nonce string              // tells this database's session markers from others'

	// pooler is set once a transaction-mode pooler is seen on a database
	// not opened with WithTransactionPooler: why it is known.
	pooler atomic.Pointer[error]

	mu            sync.Mutex
	holders       map[*conn]struct{}
	locks         map[*AdvisoryLock]struct{} // handed out and not released
	closed        bool
	closing       chan struct{}      // closed by db.Close: lockhooks' own waits stop
	cancelMonitor context.CancelFunc // stops the running monitor; nil when none runs
	done          chan struct{}      // closed when that monitor has returned
	probed        bool               // the first holder had the monitor look at once

	// deadlockLogged is when a pool deadlock was last logged (monoNow;
	// pg_turns.go).
	deadlockLogged atomic.Int64
	// unknownPoolWarned: a wait in memory was logged as unprovable (the
	// *sql.DB unknown; pg_turns.go).
	unknownPoolWarned atomic.Bool
}

func newPinning(c *connector) *pinning {
	var nonce [8]byte
	rand.Read(nonce[:])
	return &pinning{c: c, ends: pgsession.NewEndQueue(), nonce: hex.EncodeToString(nonce[:]),
		holders: make(map[*conn]struct{}), locks: make(map[*AdvisoryLock]struct{}), closing: make(chan struct{})}
}

// wakeMonitor has the running monitor check now.
func (p *pinning) wakeMonitor() {
	select {
	case p.ends.Kick() <- struct{}{}:
	default:
	}
}

// startMonitorLocked starts the monitor unless one runs or the database is
// closed; p.mu is held.
func (p *pinning) startMonitorLocked() {
	if p.cancelMonitor != nil || p.closed {
		return
	}
	var ctx context.Context
	ctx, p.cancelMonitor = context.WithCancel(context.Background())
	p.done = make(chan struct{})
	go p.monitor(ctx, p.done)
}

// observe returns the gauges' values.
func (p *pinning) observe() (held, parked int64) {
	for _, h := range p.snapshot() {
		h.pin.Lock()
		held += int64(len(h.pin.Held))
		if h.pin.Parked {
			parked++
		}
		h.pin.Unlock()
	}
	return held, parked
}

// snapshot returns the holders.
func (p *pinning) snapshot() []*conn {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Collect(maps.Keys(p.holders))
}

// register notes that c holds session locks and starts the monitor.
func (p *pinning) register(c *conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c.pin.Lock()
	live := len(c.pin.Held) > 0 && c.pin.Lost == nil && !c.pin.Closed
	c.pin.Unlock()
	if !live {
		return // emptied, lost or closed meanwhile by another goroutine
	}
	p.holders[c] = struct{}{}
	p.startMonitorLocked()
	if !c.acquiring.Load() {
		p.firstLookLocked()
	}
}

// firstLookLocked has the monitor look at once at the database's first
// session lock, unless a transaction pooler is declared: through an
// undeclared one, with the pool idle, its side connection lands on the
// backend the lock was just taken on, which proves the pooler. It must not
// look while the holder still runs a statement (the token read of an
// AdvisoryLock's acquisition): the pooler then hands the side connection
// another server connection, and with the periodic check far off nothing
// looks again. p.mu is held.
func (p *pinning) firstLookLocked() {
	if p.probed || p.c.opts.txPooler {
		return
	}
	p.probed = true
	p.wakeMonitor()
}

// acquired is called when an AdvisoryLock's acquisition on c, begun with
// c.acquiring set, has taken its lock and run its last statement (the
// token read): the first look that register held back runs now that
// nothing of the acquisition runs on c any more (its pooler's server
// connection is free), if c still holds locks. A failed acquisition only
// clears c.acquiring: it holds nothing.
func (p *pinning) acquired(c *conn) {
	c.acquiring.Store(false)
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.holders[c]; ok && p.cancelMonitor != nil {
		p.firstLookLocked()
	}
}

// unregister forgets c.
func (p *pinning) unregister(c *conn) {
	p.mu.Lock()
	delete(p.holders, c)
	if !p.ends.Empty() {
		p.startMonitorLocked() // a backend of c's to end on the server
	}
	p.mu.Unlock()
}

// holderOf returns a connection other than except that holds k,
// preferring a parked one (a shared key may have several holders, and only
// a parked one can take a rerouted unlock).
func (p *pinning) holderOf(k lockKey, except *conn) *conn {
	var inUse *conn
	for _, h := range p.snapshot() {
		if h == except {
			continue
		}
		h.pin.Lock()
		_, ok := h.pin.Held[k]
		parked := h.pin.Parked
		h.pin.Unlock()
		switch {
		case ok && parked:
			return h
		case ok:
			inUse = h
		}
	}
	return inUse
}

// track notes an AdvisoryLock handed out, for db.Close; false once
// db.Close has run.
func (p *pinning) track(l *AdvisoryLock) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.locks[l] = struct{}{}
	return true
}

// untrack forgets a released AdvisoryLock.
func (p *pinning) untrack(l *AdvisoryLock) {
	p.mu.Lock()
	delete(p.locks, l)
	p.mu.Unlock()
}

// isClosed reports whether db.Close has run.
func (p *pinning) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// settle is called whenever c's locks may have changed: a connection that
// holds nothing more is forgotten, and if it was parked it is closed, by
// whoever found out. It must be called without c.pin.exec held.
func (p *pinning) settle(c *conn) {
	c.pin.Lock()
	empty := len(c.pin.Held) == 0
	lost := c.pin.Lost != nil
	closeIt := c.pin.Parked && (empty || lost) && !c.pin.Closed
	c.pin.Unlock()
	if empty || lost {
		p.mu.Lock()
		c.pin.Lock()
		if len(c.pin.Held) == 0 || c.pin.Lost != nil {
			delete(p.holders, c)
		}
		c.pin.Unlock()
		if !p.ends.Empty() {
			p.startMonitorLocked() // a lost backend to end on the server
		}
		p.mu.Unlock()
	} else {
		p.register(c)
	}
	if closeIt {
		c.closeInner()
	}
}

// closeInner closes the physical connection once, after whatever lockhooks
// runs on it.
func (c *conn) closeInner() error {
	c.pin.exec.Lock()
	defer c.pin.exec.Unlock()
	c.pin.Lock()
	if c.pin.Closed {
		c.pin.Unlock()
		return nil
	}
	c.pin.Closed = true
	c.releaseTurnsLocked()
	c.pin.Unlock()
	c.connector.forget(c)
	c.closeHolder()
	return c.inner.Close()
}

// close is called by db.Close: every connection lockhooks kept for its
// locks is closed, which releases them on the server: parked ones at once,
// those of AdvisoryLocks through their *sql.Conn; a *sql.Conn the
// application still holds is closed by database/sql when it is returned,
// and its locks are reported lost now. One log line says what was released.
func (p *pinning) close() {
	p.mu.Lock()
	if !p.closed {
		close(p.closing)
	}
	p.closed = true
	stop, done := p.cancelMonitor, p.done
	p.cancelMonitor = nil
	holders := slices.Collect(maps.Keys(p.holders))
	locks := slices.Collect(maps.Keys(p.locks))
	p.mu.Unlock()
	if stop != nil {
		stop() // cuts a check in flight: db.Close does not wait on the network
		<-done
	}
	var released []string
	for _, h := range holders {
		h.pin.Lock()
		for k, l := range h.pin.Held {
			state := "in use"
			if h.pin.Parked {
				state = "parked"
			}
			released = append(released, fmt.Sprintf("%s on %v (%s, taken at %s, %v ago)", k, h, state, l.Site, time.Since(l.Since).Round(time.Millisecond)))
		}
		h.pin.Unlock()
		h.markLost("db.Close closed its connection, which released it", nil, 0)
		p.settle(h)
	}
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

// park withdraws c, which holds session locks, instead of closing it.
func (c *conn) park() bool {
	if c.connector.pins.isClosed() {
		return false
	}
	return c.pin.Park(time.Now())
}

// holdsLocks reports whether c must stay out of the pool.
func (c *conn) holdsLocks() bool { return c.pin.MustStayOut() }
