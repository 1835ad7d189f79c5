package lockhooks

import (
	"context"
	"database/sql"
	"testing"

	"github.com/lockhooks/lockhooks/internal/pgtest"
)

// BenchmarkDeclaredPoolerLockPaths is the lock paths through PgBouncer in
// transaction mode with WithTransactionPooler declared, per PgBouncer of
// the test matrix, against the same statements on one raw db.Conn:
//
//   - op=acquire-release: AcquireAdvisoryLock and Release (lockhooks: the
//     lock on a holder connection that keeps a server connection in a
//     transaction, and the fencing token read on another), against
//     pg_advisory_lock and pg_advisory_unlock on a raw db.Conn;
//   - op=protected: a statement of the work the lock protects, run while it
//     is held (lockhooks checks the holder first, so that none runs once the
//     holder is gone), against the same statement on the raw db.Conn that
//     holds the lock.
//
// The raw side goes through a PgBouncer of its own whose pool has one
// server connection, so that its unlock lands on the backend that locked
// (with more, a raw session lock through a transaction pooler is wrong:
// that is what WithTransactionPooler is for); lockhooks goes through the
// shared PgBouncer of that version (two server connections: the holder's,
// and one for everything else).
func BenchmarkDeclaredPoolerLockPaths(b *testing.B) {
	ctx := context.Background()
	for _, v := range pgtest.Versions {
		b.Run(v.String(), func(b *testing.B) {
			rawDSN := pgtest.StartPooler(b, pgtest.PoolerOptions{Version: v, PoolSize: 1}).DSN(b)
			dsn := pgtest.SharedPoolerOf(b, v).DSN(b)
			open := func(b *testing.B, how string) *sql.DB {
				if how == viaRaw {
					return openVia(b, how, "pgx", rawDSN)
				}
				db, err := Open("pgx", dsn, WithTransactionPooler())
				if err != nil {
					b.Fatal(err)
				}
				db.SetMaxOpenConns(2)
				return db
			}
			for _, how := range []string{viaRaw, viaLockhooks} {
				b.Run("op=acquire-release/driver="+how, func(b *testing.B) {
					db := open(b, how)
					defer db.Close()
					lock := acquireReleaseVia(how)
					b.ReportAllocs()
					for b.Loop() {
						if err := lock(ctx, db, 1); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
			for _, how := range []string{viaRaw, viaLockhooks} {
				b.Run("op=protected/driver="+how, func(b *testing.B) {
					db := open(b, how)
					b.Cleanup(func() { db.Close() }) // after the lock's release
					c := holdLockVia(b, ctx, db, how, 2)
					b.ReportAllocs()
					for b.Loop() {
						if _, err := c.ExecContext(ctx, "SELECT 1"); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		})
	}
}

// holdLockVia takes session lock key on db until b ends and returns the
// connection that holds it: AcquireAdvisoryLock's, or a raw db.Conn that
// ran pg_advisory_lock.
func holdLockVia(b *testing.B, ctx context.Context, db *sql.DB, how string, key int64) *sql.Conn {
	if how == viaLockhooks {
		l, err := AcquireAdvisoryLock(ctx, db, key)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			if err := l.Release(ctx); err != nil {
				b.Error(err)
			}
		})
		return l.Conn()
	}
	c, err := db.Conn(ctx)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := c.ExecContext(ctx, "SELECT pg_advisory_lock($1)", key); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		var ok bool
		if err := c.QueryRowContext(ctx, "SELECT pg_advisory_unlock($1)", key).Scan(&ok); err != nil || !ok {
			b.Error("unlock:", ok, err)
		}
		c.Close()
	})
	return c
}
