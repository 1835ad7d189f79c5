package bench

import (
	"context"
	"database/sql"
	"testing"

	"github.com/XSAM/otelsql"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"

	"github.com/lockhooks/lockhooks"
	"github.com/lockhooks/lockhooks/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// benchDB is one database opened raw, through lockhooks, or through
// XSAM/otelsql (the usual database instrumentation, for comparison).
type benchDB struct {
	name    string // db=...
	dialect lockhooks.Dialect
	open    func(b *testing.B, how string) *sql.DB
}

// The ways a benchmark opens its database (driver=...).
const (
	viaRaw       = "raw"
	viaLockhooks = "lockhooks"
	viaOtelsql   = "otelsql"
)

// openVia opens driverName/dsn the chosen way.
func openVia(b *testing.B, how, driverName, dsn string) *sql.DB {
	var (
		db  *sql.DB
		err error
	)
	switch how {
	case viaLockhooks:
		db, err = lockhooks.Open(driverName, dsn)
	case viaOtelsql:
		db, err = otelsql.Open(driverName, dsn)
	default:
		db, err = sql.Open(driverName, dsn)
	}
	if err != nil {
		b.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	return db
}

var benchDBs = []benchDB{
	{"sqlite-mem", lockhooks.SQLite, func(b *testing.B, how string) *sql.DB {
		return openVia(b, how, "sqlite", ":memory:") // one connection: one in-memory database
	}},
	{"postgres", lockhooks.Postgres, func(b *testing.B, how string) *sql.DB {
		return openVia(b, how, "pgx", pgtest.DSN(b))
	}},
}

// runRawAndWrapped runs fn as db=<name>/driver=raw, driver=lockhooks and
// driver=otelsql sub-benchmarks on a table t(id, v) with one row, so
// benchstat can put them side by side (-col /driver).
func runRawAndWrapped(b *testing.B, fn func(b *testing.B, db *sql.DB, d lockhooks.Dialect)) {
	for _, bd := range benchDBs {
		for _, how := range []string{viaRaw, viaLockhooks, viaOtelsql} {
			b.Run("db="+bd.name+"/driver="+how, func(b *testing.B) {
				db := bd.open(b, how)
				defer db.Close()
				if bd.dialect == lockhooks.Postgres {
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
	runRawAndWrapped(b, func(b *testing.B, db *sql.DB, d lockhooks.Dialect) {
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
	runRawAndWrapped(b, func(b *testing.B, db *sql.DB, d lockhooks.Dialect) {
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
	runRawAndWrapped(b, func(b *testing.B, db *sql.DB, d lockhooks.Dialect) {
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

// BenchmarkInsert is an autocommit INSERT: on SQLite through lockhooks it
// takes and releases the in-process writer lock.
func BenchmarkInsert(b *testing.B) {
	runRawAndWrapped(b, func(b *testing.B, db *sql.DB, d lockhooks.Dialect) {
		ctx := context.Background()
		q := "INSERT INTO t (v) VALUES (" + placeholder(d, 1) + ")"
		for b.Loop() {
			if _, err := db.ExecContext(ctx, q, 1); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// placeholder returns the n-th bind parameter in the dialect.
func placeholder(d lockhooks.Dialect, n int) string {
	if d == lockhooks.Postgres {
		return "$" + string(rune('0'+n))
	}
	return "?"
}

func mustExec(b *testing.B, db *sql.DB, query string) {
	b.Helper()
	if _, err := db.Exec(query); err != nil {
		b.Fatalf("%s: %v", query, err)
	}
}
