package lockhooks

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/lockhooks/lockhooks/internal/callsite"
	"github.com/lockhooks/lockhooks/internal/dberr"
	"github.com/lockhooks/lockhooks/internal/pgdriver"
	"github.com/lockhooks/lockhooks/internal/pgsession"
	"github.com/lockhooks/lockhooks/internal/pgstmt"
)

// AdvisoryLock is a session advisory lock held on one connection of a
// lockhooks database (on SQLite, an in-process named lock). Run the work it
// protects on [AdvisoryLock.Conn], stop it when [AdvisoryLock.Lost] is
// closed, and end it with [AdvisoryLock.Release].
type AdvisoryLock struct {
	key  int64
	db   *sql.DB
	conn *sql.Conn
	c    *conn // the wrapper's state of conn

	turn     any // the owner of this key's turn in the in-process queue (Postgres)
	turnOnce sync.Once
	// needsConn is set on the turn's owner while, its turn come, it waits
	// for a connection of the pool to take the lock on (internal/pgstmt's turns.go).
	needsConn atomic.Bool
	token     int64    // the fencing token (Token)
	taken     heldLock // how the key was taken (noteTaken), for the report of a release under the lock

	mu       sync.Mutex
	released bool

	// The argument and the row of firstRow's statements (one runs at a
	// time: the acquisition's, then Release's), kept here so that they
	// cost no allocation.
	args [1]driver.NamedValue
	row  [2]driver.Value
}

// freeTurn gives up l's turn in the in-process queue of its key, once: at
// Release, or as soon as the lock is lost (so that another acquirer of
// this process may take the key at once, instead of waiting for the lost
// lock's Release).
func (l *AdvisoryLock) freeTurn() {
	l.turnOnce.Do(func() { l.c.connector.Turns.Unlock(l.key, l.turn) })
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
	l := &AdvisoryLock{key: key, db: db, conn: sc, c: c}
	l.turn = l
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
		l = &AdvisoryLock{key: key, db: db, conn: sc, c: c, turn: l}
	}
	// The acquisition is under way until its last statement: its lock
	// statement takes no turn (it owns it already: internal/pgstmt's turns.go), and the
	// monitor's first look waits until it is done, since the token read
	// below runs on the lock's connection (pinning.acquired).
	l.c.acquiring.Store(true)
	got, tokened, err := l.lockOnServer(ctx, try)
	if err != nil || !got {
		l.c.acquiring.Store(false) // before the connection goes back
		l.abandon()
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
		l.readToken(ctx) // never fails the acquisition: the lock is held
	}
	l.noteTaken()
	l.c.advisory.Store(l)
	l.c.acquiring.Store(false)
	l.c.connector.pins.Acquired(l.c) // nothing more of the acquisition runs on it
	if l.Err() != nil {
		l.freeTurn() // lost before the line above: MarkLost could not see l
	}
	return l, true, nil
}

// abandon gives back the connection of an acquire that failed. The failed
// statement may still have taken the lock: a lock_timeout, statement_timeout
// or cancel racing the grant, or a context that ended after the server's
// answer arrived but before it was read (database/sql then reports the
// context's error). lockhooks' tracking, which the server confirms after any
// error, says whether the connection holds the key; if it does, the key is
// unlocked before the connection goes back to the pool, or, if that fails,
// the connection is closed for good (which ends its backend), so no lock
// stays behind on a parked connection for this process's next acquirer to
// wait on. The error-free path never gets here.
func (l *AdvisoryLock) abandon() {
	defer l.conn.Close()
	k := lockKey{K1: l.key}
	if !l.c.holds(k) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.c.connector.opts.lockCheckTimeout)
	defer cancel()
	var ok bool
	err := l.conn.QueryRowContext(ctx, "SELECT pg_advisory_unlock($1)", l.key).Scan(&ok)
	if err == nil && ok && !l.c.holds(k) {
		return
	}
	why := fmt.Sprintf("could not be unlocked after its acquire failed (unlock: %v, %v), so its connection is closed", ok, err)
	l.c.MarkLost(why, errors.New(why), pgsession.LossEnd)
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

// lockOnServer takes the Postgres session lock on l's connection (through
// a transaction pooler the holder polls; see pgsession.Conn.RunOnHolder). tokened
// says that the statement also took the fencing token (lockedWithToken).
func (l *AdvisoryLock) lockOnServer(ctx context.Context, try bool) (got, tokened bool, err error) {
	if !try {
		if l.c.direct && !l.c.connector.noTokenInLock.Load() {
			return l.lockedWithToken(ctx)
		}
		if err := l.lockAlone(ctx); err != nil {
			return false, false, err
		}
		return true, false, nil
	}
	if _, err := l.firstRow(ctx, "SELECT pg_try_advisory_lock($1)", l.row[:1]); err != nil {
		return false, false, fmt.Errorf("lockhooks: trying advisory lock %s: %w", describeKey(l.key), err)
	}
	got, _ = l.row[0].(bool)
	return got, false, nil
}

// lockAlone takes the Postgres session lock on l's connection with a
// statement that takes nothing else.
func (l *AdvisoryLock) lockAlone(ctx context.Context) error {
	if _, err := l.conn.ExecContext(ctx, "SELECT pg_advisory_lock($1)", l.key); err != nil {
		return fmt.Errorf("lockhooks: acquiring advisory lock %s: %w", describeKey(l.key), err)
	}
	return nil
}

// lockedWithToken takes the lock on l's connection, and the fencing token
// in the same statement where the statement goes as annotated (tokened);
// otherwise the caller reads the token apart. The token never fails the
// acquisition: where the statement failed for the token's sake
// (tokenRefused), the lock is kept if it was granted before the token
// failed, or else taken alone, with token 0. A server that refused the
// token statement outright (no pg_current_xact_id() before Postgres 13, no
// permission to call it) is never asked that way again.
func (l *AdvisoryLock) lockedWithToken(ctx context.Context) (got, tokened bool, err error) {
	row := l.row[:]
	n, err := l.firstRow(pgstmt.WithFencingToken(ctx), "SELECT pg_advisory_lock($1)", row)
	if state := dberr.SQLState(err); tokenRefused(state) && ctx.Err() == nil {
		if strings.HasPrefix(state, "42") && l.c.connector.noTokenInLock.CompareAndSwap(false, true) {
			l.c.connector.opts.logger.Warn("lockhooks: the server refuses the fencing token (pg_current_xact_id()); AdvisoryLock.Token is 0 on this database",
				"connection", l.c.String(), "error", err)
		}
		if l.c.holds(lockKey{K1: l.key}) {
			return true, true, nil // granted before the token failed (the failure's pg_locks read says so): token 0
		}
		if err := l.lockAlone(ctx); err != nil {
			return false, false, err
		}
		return true, true, nil // token 0
	}
	if err != nil {
		return false, false, fmt.Errorf("lockhooks: acquiring advisory lock %s: %w", describeKey(l.key), err)
	}
	if n == 2 && row[1] != nil { // NULL on a hot standby: 0
		l.token = pgdriver.AsInt64(row[1])
	}
	clear(row)
	return true, n == 2, nil
}

// tokenRefused reports whether SQLSTATE state is one the fencing token
// raises and a lock statement alone does not: the statement refused
// before it ran (class 42: pg_current_xact_id() undefined, 42883, or not
// permitted, 42501), no transaction id to assign (54000, near xid
// wraparound; 25006, read-only). The lock's own failures (a timeout, a
// cancel, a deadlock, a full lock table, a lost connection) are not.
func tokenRefused(state string) bool {
	return strings.HasPrefix(state, "42") || state == "54000" || state == "25006"
}

// firstRow runs query, with l's key as its argument, on l's connection
// through the statement hooks, and reads its first row (at most len(dest)
// columns) into dest; n is the number of columns. It calls the hooks
// directly, under database/sql's hold of the connection (Raw): the lock
// and unlock of AcquireAdvisoryLock and Release need none of what
// database/sql's own query path costs (its rows, the conversions of Scan,
// a goroutine per query run with a context that can end).
func (l *AdvisoryLock) firstRow(ctx context.Context, query string, dest []driver.Value) (n int, err error) {
	err = l.conn.Raw(func(any) error {
		l.args[0] = driver.NamedValue{Ordinal: 1, Value: l.key}
		rows, err := l.c.QueryContext(ctx, query, l.args[:])
		if err != nil {
			return err
		}
		n = len(rows.Columns())
		if n > len(dest) {
			rows.Close()
			return fmt.Errorf("lockhooks: %q returned %d columns, want at most %d", query, n, len(dest))
		}
		if err := rows.Next(dest[:n]); err != nil {
			rows.Close()
			if err == io.EOF {
				err = fmt.Errorf("lockhooks: %q returned no row", query)
			}
			return err
		}
		return rows.Close()
	})
	return n, err
}

// acquireInProcess takes the SQLite stand-in: an in-process named lock.
func (l *AdvisoryLock) acquireInProcess(user, ctx context.Context, try bool) (*AdvisoryLock, bool, error) {
	names := &l.c.connector.Named
	var site callsite.Stack
	site.Capture()
	if try {
		if !names.TryLock(l.key, l, takerOf(user, l, nil), &site) {
			l.conn.Close()
			return nil, false, nil
		}
		l.token = l.c.connector.tokens.next()
		return l, true, nil
	}
	_, w := l.c.connector.Waits.Start(ctx, "advisory", "exclusive", "session", AttrLockKeys.String(describeKey(l.key)))
	w.SetWaiter(l.c, siteOf(ctx), nil, "", nil)
	err := names.Lock(user, l.key, l, takerOf(user, l, nil), &site, w)
	err = explainTableWait(err, fmt.Sprintf("AcquireAdvisoryLock(%d)", l.key), fmt.Sprintf("advisory lock %d", l.key), describeKey(l.key))
	w.End(ctx, "", err)
	if err != nil {
		l.conn.Close()
		return nil, false, fmt.Errorf("lockhooks: acquiring advisory lock %s: %w", describeKey(l.key), err)
	}
	l.token = l.c.connector.tokens.next()
	return l, true, nil
}

// Key returns the lock's key.
func (l *AdvisoryLock) Key() int64 { return l.key }

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
		return fmt.Errorf("lockhooks: advisory lock %s was already released", describeKey(l.key))
	}
	l.released = true
	if l.c.connector.opts.dialect == SQLite {
		defer l.conn.Close()
		l.c.connector.Named.Unlock(l.key, l)
		return nil
	}
	// Off the connection before the unlock, which must not count as a
	// release under the lock (LoseIfReleased), and before the connection
	// goes back.
	l.c.advisory.CompareAndSwap(l, nil)
	err := l.Err()
	if err == nil {
		err = l.unlock(ctx)
	}
	l.c.connector.pins.untrack(l)
	if err == nil && l.c.holds(lockKey{K1: l.key}) {
		// The key was taken again on l.Conn() and is still held there
		// (locks stack): the connection, parked, keeps it and the key's
		// turn, so no acquirer of this process waits on the server for it
		// (internal/pgstmt's turns.go).
		l.c.adoptTurn(l.key, l.turn)
	}
	l.conn.Close()
	l.freeTurn() // the next acquirer of this process, once the lock is released
	return err
}

// unlock runs Release's unlock. If it fails and the connection still holds
// the key (lockhooks' tracking, which the server confirms after any error,
// says so), it makes sure the key does not stay held: see Release.
func (l *AdvisoryLock) unlock(ctx context.Context) error {
	// The unlock must run even when ctx is done (defer l.Release(ctx) after
	// a cancelled request): a skipped unlock would leave the lock on a
	// parked connection, and the next acquirer waiting behind it.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.c.connector.opts.lockCheckTimeout)
	defer cancel()
	ok, err := l.unlockOnce(ctx)
	if err == nil && ok {
		return nil
	}
	if err == nil {
		err = fmt.Errorf("%w: pg_advisory_unlock(%d) returned false", ErrNotLockOwner, l.key)
	} else {
		err = fmt.Errorf("lockhooks: releasing advisory lock %s: %w", describeKey(l.key), err)
	}
	k := lockKey{K1: l.key}
	if !l.c.holds(k) {
		return err
	}
	// Still held: if the unlock failed because the transaction it ran in
	// had failed (25P02; one begun by statement text: database/sql's
	// belongs to its *sql.Tx), roll that transaction back and unlock
	// again. Another failure (a timeout, say) keeps the user's work: the
	// connection is closed instead. The connection's state is read under
	// database/sql's hold of it (Raw), never beside a statement of another
	// goroutine's.
	var textTx bool
	if dberr.SQLState(err) == "25P02" {
		l.conn.Raw(func(any) error {
			l.c.pin.Lock()
			textTx = l.c.pin.TextTx && l.c.tx.inner == nil
			l.c.pin.Unlock()
			return nil
		})
	}
	if textTx {
		if _, rerr := l.conn.ExecContext(ctx, "ROLLBACK"); rerr == nil {
			if ok, uerr := l.unlockOnce(ctx); uerr == nil && ok && !l.c.holds(k) {
				return fmt.Errorf("%w; lockhooks rolled back the connection's transaction (its work was not committed) and unlocked the lock then", err)
			}
		}
	}
	if !l.c.holds(k) {
		return err
	}
	// Closing the connection ends its session, and the lock with it (its
	// backend is ended too if it outlives the connection). The turn stays
	// taken until Release has closed it: MarkLost must not free it.
	l.c.advisory.CompareAndSwap(l, nil)
	why := fmt.Sprintf("could not be unlocked at Release (%v), so its connection is closed", err)
	l.c.MarkLost(why, err, pgsession.LossEnd)
	l.c.connector.pins.Settle(l.c) // (a parked connection, after Conn().Close(), is closed here)
	return fmt.Errorf("%w; the connection still held the lock, so lockhooks closed it instead of returning it to the pool, which releases the lock on the server", err)
}

// unlockOnce runs pg_advisory_unlock for l's key on its connection, or,
// if the caller closed Conn() (the connection is parked and still holds
// the lock), rerouted to it through the pool.
func (l *AdvisoryLock) unlockOnce(ctx context.Context) (ok bool, err error) {
	if _, err = l.firstRow(ctx, "SELECT pg_advisory_unlock($1)", l.row[:1]); err == nil {
		ok, _ = l.row[0].(bool)
	}
	if errors.Is(err, sql.ErrConnDone) {
		err = l.db.QueryRowContext(ctx, "SELECT pg_advisory_unlock($1)", l.key).Scan(&ok)
	}
	return ok, err
}
