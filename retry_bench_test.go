package lockhooks

import (
	"context"
	"database/sql"
	"strings"
	"testing"

	"github.com/lockhooks/lockhooks/internal/pgtest"
)

// benchDBs are the databases the root's transaction benchmarks run on:
// in-memory SQLite and Postgres on loopback, one connection each. (The
// raw/lockhooks/otelsql comparison lives in integration/bench.)
var benchDBs = []struct {
	name    string
	dialect Dialect
	open    func(b *testing.B, how string) *sql.DB
}{
	{"sqlite-mem", SQLite, func(b *testing.B, how string) *sql.DB { return openVia(b, how, "sqlite", ":memory:") }},
	{"postgres", Postgres, func(b *testing.B, how string) *sql.DB { return openVia(b, how, "pgx", pgtest.DSN(b)) }},
}

// BenchmarkRunInTx is RunInTx's cost against the hand-written
// BEGIN/UPDATE/COMMIT it replaces: how=manual-raw is the hand-written
// transaction on the raw driver, how=manual the same through lockhooks,
// how=runintx RunInTx with its defaults (on Postgres the attempt gets its
// transaction id in BEGIN's round trip, and COMMIT is sent as
// "SELECT 1; COMMIT", so that a COMMIT cut off in flight can be resolved;
// see retry_commit.go), how=runintx-skipcheck RunInTx with
// SkipCommitCheck (the driver's BEGIN and COMMIT).
func BenchmarkRunInTx(b *testing.B) {
	for _, bd := range benchDBs {
		for _, how := range []string{"manual-raw", "manual", "runintx", "runintx-skipcheck"} {
			b.Run("db="+bd.name+"/how="+how, func(b *testing.B) {
				via := viaLockhooks
				if how == "manual-raw" {
					via = viaRaw
				}
				db := bd.open(b, via)
				defer db.Close()
				if bd.dialect == Postgres {
					mustExec(b, db, "CREATE TABLE t (id SERIAL PRIMARY KEY, v INTEGER NOT NULL)")
				} else {
					mustExec(b, db, "CREATE TABLE t (id INTEGER PRIMARY KEY, v INTEGER NOT NULL)")
				}
				mustExec(b, db, "INSERT INTO t (v) VALUES (0)")
				ctx := context.Background()
				q := "UPDATE t SET v = v + 1 WHERE id = " + placeholder(bd.dialect, 1)
				work := func(tx *sql.Tx) error {
					_, err := tx.ExecContext(ctx, q, 1)
					return err
				}
				var opts []RetryOption
				if how == "runintx-skipcheck" {
					opts = append(opts, SkipCommitCheck())
				}
				b.ReportAllocs()
				b.ResetTimer()
				for b.Loop() {
					var err error
					if strings.HasPrefix(how, "manual") {
						err = manualTx(ctx, db, work)
					} else {
						err = RunInTx(ctx, db, nil, work, opts...)
					}
					if err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// manualTx is the hand-written transaction RunInTx replaces.
func manualTx(ctx context.Context, db *sql.DB, fn func(*sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

// BenchmarkLockOrderCheck is the lock-order checker's cost per
// transaction that takes a Lock, a FOR UPDATE row lock and an UPDATE:
// check=off is the default, check=on records classes, call stacks and
// order edges (all edges already known after the first iteration, as in a
// test suite that runs the same paths repeatedly).
func BenchmarkLockOrderCheck(b *testing.B) {
	for _, bd := range benchDBs {
		for _, check := range []string{"off", "on"} {
			b.Run("db="+bd.name+"/check="+check, func(b *testing.B) {
				var opts []Option
				if check == "on" {
					opts = append(opts, WithLockOrderCheck(func(r LockOrderReport) { b.Fatalf("unexpected report: %v", r) }))
				}
				var db *sql.DB
				var err error
				if bd.dialect == Postgres {
					db, err = Open("pgx", pgtest.DSN(b), opts...)
				} else {
					db, err = Open("sqlite", ":memory:", opts...)
				}
				if err != nil {
					b.Fatal(err)
				}
				db.SetMaxOpenConns(1)
				defer db.Close()
				mustExec(b, db, "CREATE TABLE t (id INTEGER PRIMARY KEY, v INTEGER NOT NULL)")
				mustExec(b, db, "INSERT INTO t (id, v) VALUES (1, 0)")
				ctx := context.Background()
				sel := "SELECT v FROM t WHERE id = " + placeholder(bd.dialect, 1) + " FOR UPDATE"
				upd := "UPDATE t SET v = v + 1 WHERE id = " + placeholder(bd.dialect, 1)
				b.ReportAllocs()
				b.ResetTimer()
				for b.Loop() {
					err := manualTx(ctx, db, func(tx *sql.Tx) error {
						if err := Lock(ctx, tx, "bench", 1); err != nil {
							return err
						}
						var v int
						if err := tx.QueryRowContext(ctx, sel, 1).Scan(&v); err != nil {
							return err
						}
						_, err := tx.ExecContext(ctx, upd, 1)
						return err
					})
					if err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
