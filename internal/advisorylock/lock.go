package advisorylock

import (
	"context"
	"database/sql/driver"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/lockhooks/lockhooks/internal/dberr"
	"github.com/lockhooks/lockhooks/internal/keynames"
	"github.com/lockhooks/lockhooks/internal/pgdriver"
	"github.com/lockhooks/lockhooks/internal/pgsession"
	"github.com/lockhooks/lockhooks/internal/pgstmt"
)

// Database is what the locks of one database share. The adapter fills
// its exported fields when it opens the database.
type Database struct {
	CheckTimeout time.Duration    // bounds each statement a lock runs for itself (the token read, the unlock, the cleanup)
	Logger       *slog.Logger     // where the refused token is said
	Names        *keynames.Memory // names keys for a reader

	// noTokenInLock: the server refused pg_current_xact_id() (none before
	// Postgres 13, or no permission to call it), so the lock statement
	// does not take the fencing token (pgstmt.WithFencingToken).
	noTokenInLock atomic.Bool
}

// Hold is the adapter's side of a lock: how statements run on the
// connection it keeps for the lock.
type Hold interface {
	// String names the lock's connection in messages. It is called under
	// the lock of the connection's tracking (Released), so it must not
	// take that lock.
	String() string
	// FirstRow runs query, with the lock's key as its one argument, on
	// the lock's connection through the adapter's statement hooks, and
	// reads its first row (at most len(dest) columns) into dest; n is the
	// number of columns.
	FirstRow(ctx context.Context, query string, dest []driver.Value) (n int, err error)
	// Exec runs query on the lock's connection as the application's
	// statements run, with the lock's key as its one argument if withKey.
	Exec(ctx context.Context, query string, withKey bool) error
	// UnlockKey runs pg_advisory_unlock of the lock's key as the
	// application's queries run: on the lock's connection, or, if
	// throughPool, on a connection of the pool (the one that holds it, as
	// the session-lock machine reroutes it).
	UnlockKey(ctx context.Context, throughPool bool) (ok bool, err error)
	// OwnRow runs query on the lock's connection past the statement
	// hooks, annotated with the holder's identity, and returns its one
	// row; a failure that broke the connection is reported as its locks'
	// loss, as the hooks would have.
	OwnRow(ctx context.Context, query string) ([]driver.Value, error)
	// InTextTx reports whether the lock's connection is in a transaction
	// begun by statement text (BEGIN), not by the adapter's own.
	InTextTx() bool
	// Returned reports whether err says that the caller gave the lock's
	// connection back already.
	Returned(err error) bool
	// Detach takes the lock off its connection: a release of its key
	// there is no longer its loss.
	Detach()
	// Settle settles the lock's connection with its registry (a parked
	// one that was lost is closed).
	Settle()
	// Close gives the lock's connection back to the pool.
	Close()
}

// Lock is one session advisory lock held on one connection: its key, its
// fencing token, and how it was taken. Its zero value is not usable: the
// adapter fills every exported field but Token before the first call.
type Lock[K pgsession.NamedKey] struct {
	Key    int64              // the lock's key
	K      K                  // the key as the tracking knows it
	DB     *Database          // the lock's database
	Pin    *pgsession.Conn[K] // the tracking of the lock's connection
	Hold   Hold               // the adapter's side
	Direct bool               // the connection reaches the server itself, no pooler between
	Token  int64              // the fencing token (0: none could be assigned)

	taken pgsession.Held  // how the key was taken (NoteTaken)
	row   [2]driver.Value // FirstRow's row: one statement runs at a time, so it costs no allocation
}

// describe names the lock's key for a reader.
func (l *Lock[K]) describe() string { return l.DB.Names.Describe(l.Key) }

// LockOnServer takes the lock on its connection (through a transaction
// pooler the holder polls; see pgsession.Conn.RunOnHolder), or with try
// only if it is free. tokened says that the statement also took the
// fencing token (lockedWithToken).
func (l *Lock[K]) LockOnServer(ctx context.Context, try bool) (got, tokened bool, err error) {
	if !try {
		if l.Direct && !l.DB.noTokenInLock.Load() {
			return l.lockedWithToken(ctx)
		}
		if err := l.lockAlone(ctx); err != nil {
			return false, false, err
		}
		return true, false, nil
	}
	if _, err := l.Hold.FirstRow(ctx, "SELECT pg_try_advisory_lock($1)", l.row[:1]); err != nil {
		return false, false, fmt.Errorf("lockhooks: trying advisory lock %s: %w", l.describe(), err)
	}
	got, _ = l.row[0].(bool)
	return got, false, nil
}

// lockAlone takes the lock with a statement that takes nothing else.
func (l *Lock[K]) lockAlone(ctx context.Context) error {
	if err := l.Hold.Exec(ctx, "SELECT pg_advisory_lock($1)", true); err != nil {
		return fmt.Errorf("lockhooks: acquiring advisory lock %s: %w", l.describe(), err)
	}
	return nil
}

// lockedWithToken takes the lock, and the fencing token in the same
// statement where the statement goes as annotated (tokened); otherwise the
// caller reads the token apart (ReadToken). The token never fails the
// acquisition: where the statement failed for the token's sake
// (tokenRefused), the lock is kept if it was granted before the token
// failed, or else taken alone, with token 0. A server that refused the
// token statement outright (no pg_current_xact_id() before Postgres 13, no
// permission to call it) is never asked that way again.
func (l *Lock[K]) lockedWithToken(ctx context.Context) (got, tokened bool, err error) {
	row := l.row[:]
	n, err := l.Hold.FirstRow(pgstmt.WithFencingToken(ctx), "SELECT pg_advisory_lock($1)", row)
	if state := dberr.SQLState(err); tokenRefused(state) && ctx.Err() == nil {
		if strings.HasPrefix(state, "42") && l.DB.noTokenInLock.CompareAndSwap(false, true) {
			l.DB.Logger.Warn("lockhooks: the server refuses the fencing token (pg_current_xact_id()); AdvisoryLock.Token is 0 on this database",
				"connection", l.Hold.String(), "error", err)
		}
		if l.Pin.Holds(l.K) {
			return true, true, nil // granted before the token failed (the failure's pg_locks read says so): token 0
		}
		if err := l.lockAlone(ctx); err != nil {
			return false, false, err
		}
		return true, true, nil // token 0
	}
	if err != nil {
		return false, false, fmt.Errorf("lockhooks: acquiring advisory lock %s: %w", l.describe(), err)
	}
	if n == 2 && row[1] != nil { // NULL on a hot standby: 0
		l.Token = pgdriver.AsInt64(row[1])
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
