package lockhooks

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/dberr"
	"github.com/lockhooks/lockhooks/internal/inprocess"
	"github.com/lockhooks/lockhooks/internal/pgtest"
	"github.com/lockhooks/lockhooks/internal/sqlitelock"
)

// The ways a benchmark opens its database (driver=...). The comparison of
// the plain statement paths with XSAM/otelsql lives in the integration
// module (integration/bench), so the library's go.mod does not require
// otelsql.
const (
	viaRaw       = "raw"
	viaLockhooks = "lockhooks"
)

// openVia opens driverName/dsn raw or through lockhooks.
func openVia(b *testing.B, how, driverName, dsn string) *sql.DB {
	var (
		db  *sql.DB
		err error
	)
	if how == viaLockhooks {
		db, err = Open(driverName, dsn)
	} else {
		db, err = sql.Open(driverName, dsn)
	}
	if err != nil {
		b.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	return db
}

// BenchmarkIntercept is the statement hooks' cost per statement: text with
// no "for" (a byte search), a repeated locking statement (a cache hit), and
// a locking statement seen for the first time (scan and rewrite).
func BenchmarkIntercept(b *testing.B) {
	ctx := context.Background()
	noFor := `SELECT "users"."id", "users"."name" FROM "users" WHERE "users"."org_id" = $1 ORDER BY "users"."id" LIMIT 50`
	locking := `SELECT "users"."id", "users"."name" FROM "users" WHERE "users"."org_id" = $1 ORDER BY "users"."id" FOR UPDATE`
	for _, d := range []Dialect{Postgres, SQLite} {
		c := &conn{connector: newConnector(nil, nil, mustOptions(b, WithDialect(d)), "", sqlitelock.DSN{})}
		b.Run("dialect="+string(d)+"/path=no-for", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				c.intercept(ctx, noFor)
			}
		})
		b.Run("dialect="+string(d)+"/path=cached", func(b *testing.B) {
			c.intercept(ctx, locking)
			b.ReportAllocs()
			for b.Loop() {
				c.intercept(ctx, locking)
			}
		})
		b.Run("dialect="+string(d)+"/path=uncached", func(b *testing.B) {
			r := c.connector.rewriter
			b.ReportAllocs()
			for b.Loop() {
				clear(r.cache)
				c.intercept(ctx, locking)
			}
		})
	}
}

// BenchmarkLocksetUncontended is one lock and release of the in-process
// lockset table, the cost Lock adds beyond its marker statement.
func BenchmarkLocksetUncontended(b *testing.B) {
	var table inprocess.Table[inprocess.LocksetKey]
	ctx := context.Background()
	key := inprocess.LocksetKey{Namespace: "accounts", ID: "i12345678"}
	b.ReportAllocs()
	for b.Loop() {
		if err := table.Lock(ctx, key, 1, takerOf(ctx, 1, nil), nil, nil); err != nil {
			b.Fatal(err)
		}
		table.Unlock(key, 1)
	}
}

// BenchmarkLockInTx is a read-only SQLite transaction with and without a
// Lock of one id: the whole cost of Lock through database/sql.
func BenchmarkLockInTx(b *testing.B) {
	db, err := Open("sqlite", ":memory:")
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	ctx := context.Background()
	for _, lock := range []bool{false, true} {
		b.Run(fmt.Sprintf("lock=%v", lock), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				tx, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
				if err != nil {
					b.Fatal(err)
				}
				if lock {
					if err := Lock(ctx, tx, "accounts", 42); err != nil {
						b.Fatal(err)
					}
				}
				if err := tx.Commit(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkLocksetContended is lock/unlock throughput with 2, 8 and 64
// goroutines over 4 ids (heavy contention: most acquisitions wait).
func BenchmarkLocksetContended(b *testing.B) {
	for _, g := range []int{2, 8, 64} {
		b.Run(fmt.Sprintf("goroutines=%d", g), func(b *testing.B) {
			var table inprocess.Table[int]
			ctx := context.Background()
			var next atomic.Int64
			b.SetParallelism((g + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				owner := next.Add(1)
				i := int(owner)
				for pb.Next() {
					k := i % 4
					i++
					if err := table.Lock(ctx, k, owner, takerOf(ctx, owner, nil), nil, nil); err != nil {
						b.Error(err)
						return
					}
					table.Unlock(k, owner)
				}
			})
		})
	}
}

// BenchmarkFKContention is the parent/child workload: transactions insert
// a child row, then lock the parent FOR UPDATE and update it, from 4
// goroutines. It reports the parent lock's p50/p99 wait and the share of
// transactions that failed with a deadlock (deadlock_timeout 50ms).
func BenchmarkFKContention(b *testing.B) {
	dsn := pgtest.DSN(b)
	setup, err := sql.Open("pgx", dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer setup.Close()
	mustExec(b, setup, fkSchema)
	mustExec(b, setup, "ALTER DATABASE "+currentDatabase(b, setup)+" SET deadlock_timeout = '50ms'")
	for _, how := range []string{viaRaw, viaLockhooks} {
		b.Run("driver="+how, func(b *testing.B) {
			db := openVia(b, how, "pgx", dsn)
			defer db.Close()
			db.SetMaxOpenConns(4)
			ctx := context.Background()
			var mu sync.Mutex
			var waits []time.Duration
			var deadlocks int
			b.SetParallelism(2)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					wait, err := func() (time.Duration, error) {
						tx, err := db.BeginTx(ctx, nil)
						if err != nil {
							return 0, err
						}
						defer tx.Rollback()
						if _, err := tx.ExecContext(ctx, "INSERT INTO child (parent_id) VALUES (1)"); err != nil {
							return 0, err
						}
						start := time.Now()
						if _, err := tx.ExecContext(ctx, "SELECT id FROM parent WHERE id = 1 FOR UPDATE"); err != nil {
							return 0, err
						}
						wait := time.Since(start)
						if _, err := tx.ExecContext(ctx, "UPDATE parent SET counter = counter + 1 WHERE id = 1"); err != nil {
							return wait, err
						}
						return wait, tx.Commit()
					}()
					mu.Lock()
					if dberr.SQLState(err) == "40P01" {
						deadlocks++
					} else if err != nil {
						b.Error(err)
					} else {
						waits = append(waits, wait)
					}
					mu.Unlock()
				}
			})
			b.StopTimer()
			slices.Sort(waits)
			if len(waits) > 0 {
				b.ReportMetric(float64(waits[len(waits)/2].Microseconds())/1000, "p50-wait-ms")
				b.ReportMetric(float64(waits[len(waits)*99/100].Microseconds())/1000, "p99-wait-ms")
			}
			b.ReportMetric(float64(deadlocks)/float64(b.N), "deadlocks/op")
		})
	}
}

// BenchmarkBankTransferSQLite is the seed's transfer on an SQLite file from
// 8 goroutines: raw (read-modify-write in a deferred transaction) against
// lockhooks (Lock on both accounts). It reports failed transfers per op and
// how far the total drifted (lost updates).
func BenchmarkBankTransferSQLite(b *testing.B) {
	for _, how := range []string{viaRaw, viaLockhooks} {
		b.Run("driver="+how, func(b *testing.B) {
			path := filepath.Join(b.TempDir(), "bank.db")
			dsn := path + "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)&_pragma=synchronous(NORMAL)"
			db := openVia(b, how, "sqlite", dsn)
			defer db.Close()
			db.SetMaxOpenConns(8)
			mustExec(b, db, "CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL)")
			for i := range 10 {
				mustExec(b, db, fmt.Sprintf("INSERT INTO accounts VALUES (%d, 1000)", i))
			}
			ctx := context.Background()
			var failed atomic.Int64
			var seed atomic.Uint64
			b.SetParallelism(4)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				r := rand.New(rand.NewPCG(seed.Add(1), 3))
				for pb.Next() {
					from, to := r.IntN(10), r.IntN(9)
					if to >= from {
						to++
					}
					err := func() error {
						tx, err := db.BeginTx(ctx, nil)
						if err != nil {
							return err
						}
						defer tx.Rollback()
						if how == viaLockhooks {
							if err := Lock(ctx, tx, "accounts", from, to); err != nil {
								return err
							}
						}
						var a, c int
						if err := tx.QueryRowContext(ctx, "SELECT balance FROM accounts WHERE id = ?", from).Scan(&a); err != nil {
							return err
						}
						if err := tx.QueryRowContext(ctx, "SELECT balance FROM accounts WHERE id = ?", to).Scan(&c); err != nil {
							return err
						}
						if _, err := tx.ExecContext(ctx, "UPDATE accounts SET balance = ? WHERE id = ?", a-1, from); err != nil {
							return err
						}
						if _, err := tx.ExecContext(ctx, "UPDATE accounts SET balance = ? WHERE id = ?", c+1, to); err != nil {
							return err
						}
						return tx.Commit()
					}()
					if err != nil {
						failed.Add(1)
					}
				}
			})
			b.StopTimer()
			var total int
			if err := db.QueryRow("SELECT sum(balance) FROM accounts").Scan(&total); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(failed.Load())/float64(b.N), "failed/op")
			b.ReportMetric(float64(10000-total), "lost-units")
		})
	}
}

// BenchmarkVerifyOnReturn is the cost of WithVerifyOnReturn: a pg_locks read
// each time a connection goes back to the pool (here: every QueryRow on a
// pool of one connection), against raw pgx and lockhooks without it.
func BenchmarkVerifyOnReturn(b *testing.B) {
	dsn := pgtest.DSN(b)
	benchSelectOne(b, []openedAs{
		{"driver=raw", func() (*sql.DB, error) { return sql.Open("pgx", dsn) }},
		{"driver=lockhooks/verify=off", func() (*sql.DB, error) { return Open("pgx", dsn) }},
		{"driver=lockhooks/verify=on", func() (*sql.DB, error) { return Open("pgx", dsn, WithVerifyOnReturn(true)) }},
	})
}

// openedAs is one way a benchmark opens its database.
type openedAs struct {
	name string
	open func() (*sql.DB, error)
}

// openOne opens the database with a pool of one connection, closed when
// b ends.
func (w openedAs) openOne(b *testing.B) *sql.DB {
	db, err := w.open()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	db.SetMaxOpenConns(1)
	return db
}

// benchSelectOne runs QueryRow("SELECT 1") on a pool of one connection, as
// a sub-benchmark per way of opening the database.
func benchSelectOne(b *testing.B, ways []openedAs) {
	for _, w := range ways {
		b.Run(w.name, func(b *testing.B) {
			db := w.openOne(b)
			ctx := context.Background()
			var v int
			for b.Loop() {
				if err := db.QueryRowContext(ctx, "SELECT 1").Scan(&v); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkAdvisoryLockUnlock is a session lock and its unlock on one
// connection, raw pgx against lockhooks: lockhooks reads pg_locks after
// each (one round trip each), which is how a transaction-mode pooler in
// front of the database is caught (ErrTransactionPooler).
func BenchmarkAdvisoryLockUnlock(b *testing.B) {
	dsn := pgtest.DSN(b)
	for _, how := range []string{viaRaw, viaLockhooks} {
		b.Run("driver="+how, func(b *testing.B) {
			db := openVia(b, how, "pgx", dsn)
			defer db.Close()
			ctx := context.Background()
			c, err := db.Conn(ctx)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			run := lockUnlock(ctx, c, 1)
			b.ReportAllocs()
			for b.Loop() {
				if err := run(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// lockUnlock returns what BenchmarkAdvisoryLockUnlock times: session lock
// key taken on c and released. (Its result lives in the closure, so that a
// run allocates only what the statements do.)
func lockUnlock(ctx context.Context, c *sql.Conn, key int64) func() error {
	var ok bool
	return func() error {
		if _, err := c.ExecContext(ctx, "SELECT pg_advisory_lock($1)", key); err != nil {
			return err
		}
		if err := c.QueryRowContext(ctx, "SELECT pg_advisory_unlock($1)", key).Scan(&ok); err != nil || !ok {
			return fmt.Errorf("pg_advisory_unlock(%d): %v, %v", key, ok, err)
		}
		return nil
	}
}

// BenchmarkAcquireAdvisoryLockRelease is AcquireAdvisoryLock and Release
// of one key on a pool of one connection, against what a user would write
// on the raw driver: a db.Conn, pg_advisory_lock, pg_advisory_unlock and
// the connection back to the pool. lockhooks also takes the fencing token
// (Token), in the lock statement.
func BenchmarkAcquireAdvisoryLockRelease(b *testing.B) {
	dsn := pgtest.DSN(b)
	for _, how := range []string{viaRaw, viaLockhooks} {
		b.Run("driver="+how, func(b *testing.B) {
			db := openVia(b, how, "pgx", dsn)
			defer db.Close()
			ctx := context.Background()
			lock := acquireReleaseVia(how)
			b.ReportAllocs()
			for b.Loop() {
				if err := lock(ctx, db, 1); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// acquireReleaseVia returns one acquisition and release of a session
// lock: lockhooks' AcquireAdvisoryLock and Release, or its hand-written
// raw equivalent.
func acquireReleaseVia(how string) func(ctx context.Context, db *sql.DB, key int64) error {
	if how == viaLockhooks {
		return func(ctx context.Context, db *sql.DB, key int64) error {
			l, err := AcquireAdvisoryLock(ctx, db, key)
			if err != nil {
				return err
			}
			return l.Release(ctx)
		}
	}
	return func(ctx context.Context, db *sql.DB, key int64) error {
		c, err := db.Conn(ctx)
		if err != nil {
			return err
		}
		defer c.Close()
		if _, err := c.ExecContext(ctx, "SELECT pg_advisory_lock($1)", key); err != nil {
			return err
		}
		var ok bool
		if err := c.QueryRowContext(ctx, "SELECT pg_advisory_unlock($1)", key).Scan(&ok); err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("pg_advisory_unlock(%d) returned false", key)
		}
		return nil
	}
}

// BenchmarkSQLiteWriteDecision is what an autocommit SQLite statement
// costs the hooks before it runs: intercept, then whether it writes (and
// so takes the writer lock). A classified statement carries the answer
// from the cache; one with neither "for" nor "advisory" asks IsWrite.
func BenchmarkSQLiteWriteDecision(b *testing.B) {
	ctx := context.Background()
	c := &conn{connector: newConnector(nil, nil, mustOptions(b, WithDialect(SQLite)), "", sqlitelock.DSN{})}
	for _, q := range []struct{ name, text string }{
		{"cached", `INSERT INTO "forms" ("id", "name", "org_id") VALUES (?, ?, ?) ON CONFLICT ("id") DO UPDATE SET "name" = excluded."name"`},
		{"no-for", `INSERT INTO "users" ("id", "name", "org_id") VALUES (?, ?, ?) ON CONFLICT ("id") DO UPDATE SET "name" = excluded."name"`},
	} {
		b.Run("path="+q.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				c.intercept(ctx, q.text).writes()
			}
		})
	}
}

// BenchmarkLockPathsPaired runs the two lock paths of
// BenchmarkAdvisoryLockUnlock and BenchmarkAcquireAdvisoryLockRelease on
// the raw driver and through lockhooks alternately, one of each per
// iteration, on two databases of one pool connection each and two keys
// (see pairedRun): other/raw is lockhooks' time against the raw driver's
// on the same machine at the same moment, cpu-other/raw its time on CPU,
// client and server.
func BenchmarkLockPathsPaired(b *testing.B) {
	dsn := pgtest.DSN(b)
	ctx := context.Background()
	b.Run("path=lock-unlock", func(b *testing.B) {
		var conns [2]*sql.Conn
		var backends [2]string
		for i, how := range []string{viaRaw, viaLockhooks} {
			db := openVia(b, how, "pgx", dsn)
			defer db.Close()
			c, err := db.Conn(ctx)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			conns[i], backends[i] = c, backendOf(b, c)
		}
		raw, other := lockUnlock(ctx, conns[0], 1), lockUnlock(ctx, conns[1], 2)
		warmPairedRun(b, backends, raw, other)
	})
	b.Run("path=acquire-release", func(b *testing.B) {
		var dbs [2]*sql.DB
		var backends [2]string
		for i, how := range []string{viaRaw, viaLockhooks} {
			db := openVia(b, how, "pgx", dsn)
			defer db.Close()
			db.SetMaxOpenConns(1)
			dbs[i], backends[i] = db, backendOf(b, db)
		}
		rawLock, lock := acquireReleaseVia(viaRaw), acquireReleaseVia(viaLockhooks)
		raw := func() error { return rawLock(ctx, dbs[0], 1) }
		other := func() error { return lock(ctx, dbs[1], 2) }
		warmPairedRun(b, backends, raw, other)
	})
}

// warmPairedRun runs raw and other ten times each (prepared statements;
// lockhooks' annotated ones are prepared at their second sighting), then
// pairedRun on them.
func warmPairedRun(b *testing.B, backends [2]string, raw, other func() error) {
	for range 10 {
		if err := raw(); err != nil {
			b.Fatal(err)
		}
		if err := other(); err != nil {
			b.Fatal(err)
		}
	}
	pairedRun(b, "raw", backends[0], backends[1], raw, other)
}
