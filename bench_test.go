package lockhooks

import (
	"context"
	"database/sql"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/lockhooks/lockhooks/internal/pgtest"
)

// benchDB is one database opened raw and through the wrapper.
type benchDB struct {
	name    string // db=...
	dialect Dialect
	open    func(b *testing.B, wrapped bool) *sql.DB
}

var benchDBs = []benchDB{
	{"sqlite-mem", SQLite, func(b *testing.B, wrapped bool) *sql.DB {
		var (
			db  *sql.DB
			err error
		)
		if wrapped {
			db, err = Open("sqlite", ":memory:")
		} else {
			db, err = sql.Open("sqlite", ":memory:")
		}
		if err != nil {
			b.Fatal(err)
		}
		db.SetMaxOpenConns(1) // one in-memory database
		return db
	}},
	{"postgres", Postgres, func(b *testing.B, wrapped bool) *sql.DB {
		dsn := pgtest.DSN(b)
		var (
			db  *sql.DB
			err error
		)
		if wrapped {
			db, err = Open("pgx", dsn)
		} else {
			db, err = sql.Open("pgx", dsn)
		}
		if err != nil {
			b.Fatal(err)
		}
		db.SetMaxOpenConns(1)
		return db
	}},
}

// runRawAndWrapped runs fn as db=<name>/driver=raw and driver=lockhooks
// sub-benchmarks on a table t(id, v) with one row, so benchstat can put
// them side by side (-col /driver).
func runRawAndWrapped(b *testing.B, fn func(b *testing.B, db *sql.DB, d Dialect)) {
	for _, bd := range benchDBs {
		for _, wrapped := range []bool{false, true} {
			name := "db=" + bd.name + "/driver=raw"
			if wrapped {
				name = "db=" + bd.name + "/driver=lockhooks"
			}
			b.Run(name, func(b *testing.B) {
				db := bd.open(b, wrapped)
				defer db.Close()
				if bd.dialect == Postgres {
					mustExec(b, db, "CREATE TABLE t (id SERIAL PRIMARY KEY, v INTEGER NOT NULL)")
				} else {
					mustExec(b, db, "CREATE TABLE t (id INTEGER PRIMARY KEY, v INTEGER NOT NULL)")
				}
				mustExec(b, db, "INSERT INTO t (v) VALUES (0)")
				b.ReportAllocs()
				b.ResetTimer()
				fn(b, db, bd.dialect)
			})
		}
	}
}

func BenchmarkExec(b *testing.B) {
	runRawAndWrapped(b, func(b *testing.B, db *sql.DB, d Dialect) {
		ctx := context.Background()
		q := "UPDATE t SET v = v + 1 WHERE id = " + placeholder(d, 1)
		for b.Loop() {
			if _, err := db.ExecContext(ctx, q, 1); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkQueryRow(b *testing.B) {
	runRawAndWrapped(b, func(b *testing.B, db *sql.DB, d Dialect) {
		ctx := context.Background()
		q := "SELECT v FROM t WHERE id = " + placeholder(d, 1)
		var v int
		for b.Loop() {
			if err := db.QueryRowContext(ctx, q, 1).Scan(&v); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkTx(b *testing.B) {
	runRawAndWrapped(b, func(b *testing.B, db *sql.DB, d Dialect) {
		ctx := context.Background()
		q := "UPDATE t SET v = v + 1 WHERE id = " + placeholder(d, 1)
		for b.Loop() {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := tx.ExecContext(ctx, q, 1); err != nil {
				b.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkIntercept is the statement hooks' cost per statement: text with
// no "for" (a byte search), a repeated locking statement (a cache hit), and
// a locking statement seen for the first time (scan and rewrite).
func BenchmarkIntercept(b *testing.B) {
	ctx := context.Background()
	noFor := `SELECT "users"."id", "users"."name" FROM "users" WHERE "users"."org_id" = $1 ORDER BY "users"."id" LIMIT 50`
	locking := `SELECT "users"."id", "users"."name" FROM "users" WHERE "users"."org_id" = $1 ORDER BY "users"."id" FOR UPDATE`
	for _, d := range []Dialect{Postgres, SQLite} {
		c := &conn{connector: newConnector(nil, nil, mustOptions(b, WithDialect(d)))}
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

// BenchmarkInsert is an autocommit INSERT: on SQLite through lockhooks it
// takes and releases the in-process writer lock.
func BenchmarkInsert(b *testing.B) {
	runRawAndWrapped(b, func(b *testing.B, db *sql.DB, d Dialect) {
		ctx := context.Background()
		q := "INSERT INTO t (v) VALUES (" + placeholder(d, 1) + ")"
		for b.Loop() {
			if _, err := db.ExecContext(ctx, q, 1); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkLocksetUncontended is one lock and release of the in-process
// lockset table, the cost Lock adds beyond its marker statement.
func BenchmarkLocksetUncontended(b *testing.B) {
	var table lockTable[locksetKey]
	ctx := context.Background()
	key := locksetKey{"accounts", "i12345678"}
	b.ReportAllocs()
	for b.Loop() {
		if err := table.lock(ctx, key, 1, nil); err != nil {
			b.Fatal(err)
		}
		table.unlock(key, 1)
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
			var table lockTable[int]
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
					if err := table.lock(ctx, k, owner, nil); err != nil {
						b.Error(err)
						return
					}
					table.unlock(k, owner)
				}
			})
		})
	}
}
