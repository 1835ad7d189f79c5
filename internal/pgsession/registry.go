package pgsession

import (
	"context"
	"crypto/rand"
	"database/sql/driver"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
)

// The registry of one Postgres database's connections that hold session
// locks, in use or parked: registering and settling them, closing a
// parked one once it holds nothing, db.Close, and the proof of an
// undeclared transaction pooler. Its monitor is monitor.go's.

// NamedKey is a [Key] that names itself for messages (the root's key
// formats a bigint key by the name it was made from).
type NamedKey = advisorykey.Named

// A Member is one connection of a database as its [Registry] sees it: the
// caller's own connection type (a pointer), whose state is a [State] and
// whose statements the caller runs.
type Member[K NamedKey] interface {
	comparable
	fmt.Stringer
	// Session returns the connection's state of its advisory locks.
	Session() *State[K]
	// ID is the connection's number in its database; PID is its backend's
	// pid (0 until known).
	ID() uint64
	PID() int32
	// LockPID is the backend its session locks live on (a transaction
	// pooler's holder's, through one), 0 when none is known.
	LockPID() int32
	// Acquiring reports whether an AdvisoryLock's acquisition runs on the
	// connection (its monitor's first look waits for it: [Registry.Acquired]).
	Acquiring() bool
	// MarkLost records that the session locks of the connection's lock
	// backend are gone, why completing "…held advisory lock k and",
	// reported as flags say, and returns the loss (nil if it held none).
	MarkLost(why string, cause error, flags LossFlags) error
	// Answers reports whether the parked connection still answers a
	// statement of lockhooks' own; one whose connection broke is lost.
	Answers(ctx context.Context) bool
	// VerifyParked reads pg_locks on the parked connection: one that
	// fails is lost, one that works makes its tracking true.
	VerifyParked(ctx context.Context)
	// PoolerDetected is the error for a connection found sharing a
	// backend with another client, what saying how.
	PoolerDetected(what string) error
	// CloseInner closes the physical connection once, after whatever
	// lockhooks runs on it, and sets its State's Closed.
	CloseInner() error
}

// LossFlags say how [Member.MarkLost] treats a loss.
type LossFlags uint8

const (
	// LossReport logs and counts the loss (db.Close reports its own way).
	LossReport LossFlags = 1 << iota
	// LossEnd ends the backend on the server, where it may still live
	// (its socket half-open, or a connection lockhooks gave up on): the
	// key is free only once it is gone.
	LossEnd
	// LossPooler: the locks are lost to a transaction-mode pooler; the
	// error wraps the pooler's sentinel too.
	LossPooler
)

// Config is what a [Registry] needs of its database.
type Config[C any] struct {
	// Settings are the database's, which its connections follow too
	// (Registry.Settings).
	Settings
	CheckInterval time.Duration // how often the monitor checks the holders
	ParkedWarning time.Duration // a parked hold longer than this is logged once; 0: never
	// Connect opens a connection outside the pool, the monitor's side
	// connection.
	Connect func(ctx context.Context) (driver.Conn, error)
	// OpenConn returns the database's open connection numbered id.
	OpenConn func(id uint64) (C, bool)
	// LongHold records that a parked connection held a lock longer than
	// ParkedWarning (msg says which), among the database's events.
	LongHold func(msg string)
}

// Registry is the advisory-lock state of one Postgres database: the
// connections holding session locks (in use or parked) and the monitor
// that checks their holders are still alive.
//
// Lock order: the registry's mutex, then a member's own serialisation of
// lockhooks' statements (the caller's), then its State's mutex. Code
// holding a State's mutex never calls into the registry. The end queue's
// mutex and the in-process turn table's are leaves: taken under any of
// these, nothing is taken under them.
type Registry[K NamedKey, C Member[K]] struct {
	cfg   Config[C]
	ends  *EndQueue // backends of lost holders to end on the server
	nonce string    // tells this database's session markers from others'

	// pooler is set once a transaction-mode pooler is seen on a database
	// not opened with WithTransactionPooler: why it is known.
	pooler atomic.Pointer[error]

	mu            sync.Mutex
	holders       map[C]struct{}
	closed        bool
	closing       chan struct{}      // closed by db.Close: lockhooks' own waits stop
	cancelMonitor context.CancelFunc // stops the running monitor; nil when none runs
	done          chan struct{}      // closed when that monitor has returned
	probed        bool               // the first holder had the monitor look at once
}

// Settings returns the database's settings, for its connections
// (Conn.Init).
func (p *Registry[K, C]) Settings() *Settings { return &p.cfg.Settings }

// NewRegistry returns the empty registry of one database.
func NewRegistry[K NamedKey, C Member[K]](cfg Config[C]) *Registry[K, C] {
	var nonce [8]byte
	rand.Read(nonce[:])
	return &Registry[K, C]{cfg: cfg, ends: NewEndQueue(), nonce: hex.EncodeToString(nonce[:]),
		holders: make(map[C]struct{}), closing: make(chan struct{})}
}

// Ends is the queue of backends of lost holders to end on the server.
func (p *Registry[K, C]) Ends() *EndQueue { return p.ends }

// Closing is closed by db.Close: lockhooks' own waits stop.
func (p *Registry[K, C]) Closing() <-chan struct{} { return p.closing }

// WakeMonitor has the running monitor check now.
func (p *Registry[K, C]) WakeMonitor() {
	select {
	case p.ends.Kick() <- struct{}{}:
	default:
	}
}

// startMonitorLocked starts the monitor unless one runs or the database is
// closed; p.mu is held.
func (p *Registry[K, C]) startMonitorLocked() {
	if p.cancelMonitor != nil || p.closed {
		return
	}
	var ctx context.Context
	ctx, p.cancelMonitor = context.WithCancel(context.Background())
	p.done = make(chan struct{})
	go p.monitor(ctx, p.done)
}

// Idle reports whether no end request waits and no monitor runs.
func (p *Registry[K, C]) Idle() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ends.Empty() && p.cancelMonitor == nil
}

// MonitorRunning reports whether the monitor runs.
func (p *Registry[K, C]) MonitorRunning() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cancelMonitor != nil
}

// Registered reports whether c is among the holders.
func (p *Registry[K, C]) Registered(c C) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.holders[c]
	return ok
}

// Observe returns the gauges' values: the session locks held, and the
// connections parked.
func (p *Registry[K, C]) Observe() (held, parked int64) {
	for _, h := range p.Snapshot() {
		s := h.Session()
		s.Lock()
		held += int64(len(s.Held))
		if s.Parked {
			parked++
		}
		s.Unlock()
	}
	return held, parked
}

// Snapshot returns the holders.
func (p *Registry[K, C]) Snapshot() []C {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Collect(maps.Keys(p.holders))
}

// register notes that c holds session locks and starts the monitor.
func (p *Registry[K, C]) register(c C) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := c.Session()
	s.Lock()
	live := len(s.Held) > 0 && s.Lost == nil && !s.Closed
	s.Unlock()
	if !live {
		return // emptied, lost or closed meanwhile by another goroutine
	}
	p.holders[c] = struct{}{}
	p.startMonitorLocked()
	if !c.Acquiring() {
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
func (p *Registry[K, C]) firstLookLocked() {
	if p.probed || p.cfg.TxPooler {
		return
	}
	p.probed = true
	p.WakeMonitor()
}

// Acquired is called when an AdvisoryLock's acquisition on c has taken
// its lock and run its last statement (the token read), and c no longer
// reports Acquiring: the first look that register held back runs now that
// nothing of the acquisition runs on c any more (its pooler's server
// connection is free), if c still holds locks.
func (p *Registry[K, C]) Acquired(c C) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.holders[c]; ok && p.cancelMonitor != nil {
		p.firstLookLocked()
	}
}

// Unregister forgets c.
func (p *Registry[K, C]) Unregister(c C) {
	p.mu.Lock()
	delete(p.holders, c)
	if !p.ends.Empty() {
		p.startMonitorLocked() // a backend of c's to end on the server
	}
	p.mu.Unlock()
}

// HolderOf returns a connection other than except that holds k,
// preferring a parked one (a shared key may have several holders, and only
// a parked one can take a rerouted unlock); ok is false when none does.
func (p *Registry[K, C]) HolderOf(k K, except C) (holder C, ok bool) {
	var inUse C
	found := false
	for _, h := range p.Snapshot() {
		if h == except {
			continue
		}
		s := h.Session()
		s.Lock()
		_, holds := s.Held[k]
		parked := s.Parked
		s.Unlock()
		switch {
		case holds && parked:
			return h, true
		case holds:
			inUse, found = h, true
		}
	}
	return inUse, found
}

// IsClosed reports whether db.Close has run.
func (p *Registry[K, C]) IsClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// Settle is called whenever c's locks may have changed: a connection that
// holds nothing more is forgotten, and if it was parked it is closed, by
// whoever found out. It must be called without c's serialisation of
// lockhooks' statements held.
func (p *Registry[K, C]) Settle(c C) {
	s := c.Session()
	s.Lock()
	empty := len(s.Held) == 0
	lost := s.Lost != nil
	closeIt := s.Parked && (empty || lost) && !s.Closed
	s.Unlock()
	if empty || lost {
		p.mu.Lock()
		s.Lock()
		if len(s.Held) == 0 || s.Lost != nil {
			delete(p.holders, c)
		}
		s.Unlock()
		if !p.ends.Empty() {
			p.startMonitorLocked() // a lost backend to end on the server
		}
		p.mu.Unlock()
	} else {
		p.register(c)
	}
	if closeIt {
		c.CloseInner()
	}
}

// Close is called by db.Close: every connection lockhooks kept for its
// locks is closed, which releases them on the server: parked ones at once;
// a connection the application still holds is closed by database/sql when
// it is returned, and its locks are reported lost now. It stops the
// monitor, also in the middle of a check, and returns the locks released,
// for the caller's one log line.
func (p *Registry[K, C]) Close() (released []string) {
	p.mu.Lock()
	if !p.closed {
		close(p.closing)
	}
	p.closed = true
	stop, done := p.cancelMonitor, p.done
	p.cancelMonitor = nil
	holders := slices.Collect(maps.Keys(p.holders))
	p.mu.Unlock()
	if stop != nil {
		stop() // cuts a check in flight: db.Close does not wait on the network
		<-done
	}
	for _, h := range holders {
		s := h.Session()
		s.Lock()
		for k, l := range s.Held {
			state := "in use"
			if s.Parked {
				state = "parked"
			}
			released = append(released, fmt.Sprintf("%s on %v (%s, taken at %s, %v ago)", k.String(), h, state, l.Site, time.Since(l.Since).Round(time.Millisecond)))
		}
		s.Unlock()
		h.MarkLost("db.Close closed its connection, which released it", nil, 0)
		p.Settle(h)
	}
	return released
}

// MarkerPrefix starts every lockhooks session marker: the custom setting
// lockhooks.session a connection leaves on its backend, this prefix, its
// database's nonce, a colon and its number.
const MarkerPrefix = "lh:"

// Marker returns the session marker of this database's connection
// numbered id.
func (p *Registry[K, C]) Marker(id uint64) string {
	return MarkerPrefix + p.nonce + ":" + strconv.FormatUint(id, 10)
}

// OwnerOf returns the open connection of this database whose session
// marker m is.
func (p *Registry[K, C]) OwnerOf(m string) (owner C, ok bool) {
	rest, ok := strings.CutPrefix(m, MarkerPrefix+p.nonce+":")
	if !ok {
		return owner, false
	}
	id, err := strconv.ParseUint(rest, 10, 64)
	if err != nil {
		return owner, false
	}
	return p.cfg.OpenConn(id)
}

// SawPooler records proof of a transaction-mode pooler on a database not
// opened with WithTransactionPooler, once, and has the monitor report the
// holders.
func (p *Registry[K, C]) SawPooler(err error) {
	if p.cfg.TxPooler || p.cfg.PinningPooler {
		return
	}
	if p.pooler.CompareAndSwap(nil, &err) {
		p.cfg.Logger.Error("lockhooks: this database's DSN goes through a transaction-mode pooler; its session advisory locks are refused from now on, and those held are lost", "error", err.Error())
		p.WakeMonitor()
	}
}

// PoolerSeen returns the proof of a transaction-mode pooler on a database
// not opened with WithTransactionPooler, or nil.
func (p *Registry[K, C]) PoolerSeen() error {
	if e := p.pooler.Load(); e != nil {
		return *e
	}
	return nil
}
