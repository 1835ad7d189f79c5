package lockhooks

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/lockhooks/lockhooks/internal/advisorylock"
	"github.com/lockhooks/lockhooks/internal/callsite"
)

// AdvisoryLock is a session advisory lock held on one connection of a
// lockhooks database (on SQLite, an in-process named lock). Run the work it
// protects on [AdvisoryLock.Conn], stop it when [AdvisoryLock.Lost] is
// closed, and end it with [AdvisoryLock.Release].
type AdvisoryLock struct {
	lock advisorylock.Lock[lockKey] // what the lock does on the server, and its key and token (internal/advisorylock)
	db   *sql.DB
	conn *sql.Conn
	c    *conn // the wrapper's state of conn

	turn     any // the owner of this key's turn in the in-process queue (Postgres)
	turnOnce sync.Once
	// needsConn is set on the turn's owner while, its turn come, it waits
	// for a connection of the pool to take the lock on (internal/pgstmt's turns.go).
	needsConn atomic.Bool

	mu       sync.Mutex
	released bool

	// The argument of FirstRow's statements (one runs at a time: the
	// acquisition's, then Release's), kept here so that it costs no
	// allocation.
	args [1]driver.NamedValue
}

// newAdvisoryLock returns the AdvisoryLock of key on sc (c, its wrapper's
// state), whose turn is owned by turn (nil: by itself).
func newAdvisoryLock(key int64, db *sql.DB, sc *sql.Conn, c *conn, turn any) *AdvisoryLock {
	l := &AdvisoryLock{db: db, conn: sc, c: c, turn: turn}
	if turn == nil {
		l.turn = l
	}
	l.lock = advisorylock.Lock[lockKey]{Key: key, K: lockKey{K1: key}, DB: &c.connector.advisory,
		Pin: &c.pin, Hold: (*lockHold)(l), Direct: c.direct}
	return l
}

// freeTurn gives up l's turn in the in-process queue of its key, once: at
// Release, or as soon as the lock is lost (so that another acquirer of
// this process may take the key at once, instead of waiting for the lost
// lock's Release).
func (l *AdvisoryLock) freeTurn() {
	l.turnOnce.Do(func() { l.c.connector.Turns.Unlock(l.lock.Key, l.turn) })
}

// AcquireAdvisoryLock takes the exclusive session advisory lock key
// (pg_advisory_lock), waiting until it is free or ctx ends, on a connection
// of db it keeps for the lock. db must be opened through lockhooks. Use
// [LockID] to derive key from a name. On SQLite the lock is in-process.
func AcquireAdvisoryLock(ctx context.Context, db *sql.DB, key int64) (*AdvisoryLock, error) {
	l, ok, err := acquire(ctx, db, key, false)
	if err == nil && !ok {
		err = errors.New("lockhooks: pg_advisory_lock returned without the lock")
	}
	return l, err
}

// TryAdvisoryLock takes the exclusive session advisory lock key if it is
// free (pg_try_advisory_lock); ok is false, and l nil, if another session
// holds it.
func TryAdvisoryLock(ctx context.Context, db *sql.DB, key int64) (l *AdvisoryLock, ok bool, err error) {
	return acquire(ctx, db, key, true)
}

// acquire takes key for an AdvisoryLock. On Postgres, this process's
// acquirers of one key queue in memory (FIFO, honouring ctx, holding no
// connection while they wait): only the one whose turn it is waits on the
// server, on one connection, so waiters never pin the pool. Across
// processes the server decides, as before. user is the caller's own
// context, by which self-waits are recognised; the statements run with a
// context that also carries the caller's call site (named through the
// database's callsite.Names: no symbolising per acquisition).
func acquire(user context.Context, db *sql.DB, key int64, try bool) (*AdvisoryLock, bool, error) {
	var site callsite.Stack
	site.CaptureFast()
	sc, c, err := lockhooksConn(user, db)
	if err != nil {
		return nil, false, err
	}
	ctx := context.WithValue(user, callSiteKey{}, c.connector.sites.Of(&site))
	l := newAdvisoryLock(key, db, sc, c, nil)
	if c.connector.opts.dialect == SQLite {
		return l.acquireInProcess(user, ctx, try)
	}
	turns, taker := &c.connector.Turns, takerOf(user, l, nil)
	if !turns.TryLock(key, l, taker, &site) {
		sc.Close() // wait without a connection
		if try {
			return nil, false, nil // another acquirer of this process holds or awaits it
		}
		_, w := c.connector.Waits.Start(ctx, "advisory", "exclusive", "session", AttrLockKeys.String(describeKey(key)))
		w.SetWaiter(c, siteOf(ctx), nil, "", nil)
		err := turns.Lock(user, key, l, taker, &site, w)
		err = explainTableWait(err, fmt.Sprintf("AcquireAdvisoryLock(%d)", key), "its turn behind another acquirer of this process", describeKey(key))
		w.End(ctx, "", err)
		if err != nil {
			return nil, false, fmt.Errorf("lockhooks: acquiring advisory lock %s (waiting behind another acquirer in this process): %w", describeKey(key), err)
		}
		// l owns the turn; the lock itself is taken on a connection of its
		// own, and held by a new value (l stays the turn's owner, read by
		// the debug page, and is never written again).
		l.needsConn.Store(true)
		sc, c, err = lockhooksConn(ctx, db)
		l.needsConn.Store(false)
		if err != nil {
			turns.Unlock(key, l)
			return nil, false, err
		}
		l = newAdvisoryLock(key, db, sc, c, l)
	}
	// The acquisition is under way until its last statement: its lock
	// statement takes no turn (it owns it already: internal/pgstmt's turns.go), and the
	// monitor's first look waits until it is done, since the token read
	// below runs on the lock's connection (pinning.acquired).
	l.c.acquiring.Store(true)
	got, tokened, err := l.lock.LockOnServer(ctx, try)
	if err != nil || !got {
		l.c.acquiring.Store(false) // before the connection goes back
		l.lock.Abandon()
		l.freeTurn()
		return nil, false, err
	}
	if !l.c.connector.pins.track(l) {
		l.c.acquiring.Store(false)
		l.conn.Close() // db.Close ran meanwhile: the lock goes with the connection
		l.freeTurn()
		return nil, false, fmt.Errorf("%w: advisory lock %s: the database was closed while it was acquired", ErrLockLost, describeKey(key))
	}
	if !tokened {
		l.lock.ReadToken(ctx) // never fails the acquisition: the lock is held
	}
	l.lock.NoteTaken()
	l.c.advisory.Store(l)
	l.c.acquiring.Store(false)
	l.c.connector.pins.Acquired(l.c) // nothing more of the acquisition runs on it
	if l.Err() != nil {
		l.freeTurn() // lost before the line above: MarkLost could not see l
	}
	return l, true, nil
}

// lockhooksConn takes a connection of db and its lockhooks state.
func lockhooksConn(ctx context.Context, db *sql.DB) (*sql.Conn, *conn, error) {
	sc, err := db.Conn(ctx)
	if err != nil {
		return nil, nil, err
	}
	var c *conn
	defer func() {
		if c != nil {
			c.connector.noteDB(db)
		}
	}()
	if err := sc.Raw(func(dc any) error {
		w, ok := dc.(connCore)
		if !ok {
			return fmt.Errorf("lockhooks: AcquireAdvisoryLock needs a database opened through lockhooks (lockhooks.Open, OpenDB or a lockhooks+ driver name); this one's connections are %T", dc)
		}
		c = w.state()
		return nil
	}); err != nil {
		sc.Close()
		return nil, nil, err
	}
	return sc, c, nil
}

// acquireInProcess takes the SQLite stand-in: an in-process named lock.
func (l *AdvisoryLock) acquireInProcess(user, ctx context.Context, try bool) (*AdvisoryLock, bool, error) {
	names := &l.c.connector.Named
	var site callsite.Stack
	site.Capture()
	if try {
		if !names.TryLock(l.lock.Key, l, takerOf(user, l, nil), &site) {
			l.conn.Close()
			return nil, false, nil
		}
		l.lock.Token = l.c.connector.tokens.Next()
		return l, true, nil
	}
	_, w := l.c.connector.Waits.Start(ctx, "advisory", "exclusive", "session", AttrLockKeys.String(describeKey(l.lock.Key)))
	w.SetWaiter(l.c, siteOf(ctx), nil, "", nil)
	err := names.Lock(user, l.lock.Key, l, takerOf(user, l, nil), &site, w)
	err = explainTableWait(err, fmt.Sprintf("AcquireAdvisoryLock(%d)", l.lock.Key), fmt.Sprintf("advisory lock %d", l.lock.Key), describeKey(l.lock.Key))
	w.End(ctx, "", err)
	if err != nil {
		l.conn.Close()
		return nil, false, fmt.Errorf("lockhooks: acquiring advisory lock %s: %w", describeKey(l.lock.Key), err)
	}
	l.lock.Token = l.c.connector.tokens.Next()
	return l, true, nil
}

// Key returns the lock's key.
func (l *AdvisoryLock) Key() int64 { return l.lock.Key }

// Conn returns the connection that holds the lock. Run the protected work
// on it: its statements fail with an error wrapping [ErrLockLost] once the
// lock is lost, instead of running unprotected. Do not close it; Release
// does.
func (l *AdvisoryLock) Conn() *sql.Conn { return l.conn }

// Lost returns a channel that is closed when the lock is known lost: its
// connection died, or a statement on [AdvisoryLock.Conn] released it
// (pg_advisory_unlock of its key, pg_advisory_unlock_all, DISCARD ALL;
// closed before that statement returns), so another session may hold the
// lock now. lockhooks checks the holder's backend every
// WithLockCheckInterval (default 1s); a server it cannot reach then counts
// as lost too (the lock cannot be assumed held). The old backend, if it
// still lives, is ended once the server can be reached, where lockhooks
// can prove it is still its own (a connection to the server itself, not
// through a pooler). Once Lost is closed, another acquirer of this process
// may take the key at once. On SQLite the in-process lock cannot be lost
// and the channel never closes.
func (l *AdvisoryLock) Lost() <-chan struct{} {
	return l.c.pin.LostChan()
}

// Err returns nil while the lock is held, and an error wrapping
// [ErrLockLost] once it is lost.
func (l *AdvisoryLock) Err() error {
	l.c.pin.Lock()
	defer l.c.pin.Unlock()
	return l.c.pin.Lost
}

// Release unlocks the lock, checking that the unlock released it, and gives
// the connection back to the pool. It returns an error wrapping
// [ErrLockLost] if the lock was lost meanwhile. Releasing twice is an error.
//
// If the unlock fails while the connection still holds the lock (the
// protected work left it in a failed transaction, say), Release does not
// give the connection back holding it: it rolls back a transaction begun by
// statement text (BEGIN) and unlocks again, or else closes the connection,
// which releases the lock on the server. Either way the error says so, and
// this process's next acquirer of the key gets its turn only once the lock
// is released on the server.
func (l *AdvisoryLock) Release(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.released {
		return fmt.Errorf("lockhooks: advisory lock %s was already released", describeKey(l.lock.Key))
	}
	l.released = true
	if l.c.connector.opts.dialect == SQLite {
		defer l.conn.Close()
		l.c.connector.Named.Unlock(l.lock.Key, l)
		return nil
	}
	// Off the connection before the unlock, which must not count as a
	// release under the lock (LoseIfReleased), and before the connection
	// goes back.
	l.c.advisory.CompareAndSwap(l, nil)
	err := l.Err()
	if err == nil {
		err = l.lock.Unlock(ctx)
	}
	l.c.connector.pins.untrack(l)
	if err == nil && l.c.holds(lockKey{K1: l.lock.Key}) {
		// The key was taken again on l.Conn() and is still held there
		// (locks stack): the connection, parked, keeps it and the key's
		// turn, so no acquirer of this process waits on the server for it
		// (internal/pgstmt's turns.go).
		l.c.adoptTurn(l.lock.Key, l.turn)
	}
	l.conn.Close()
	l.freeTurn() // the next acquirer of this process, once the lock is released
	return err
}
