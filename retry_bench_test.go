package lockhooks

import (
	"context"
	"database/sql"
	"testing"
)

// BenchmarkRunInTx is RunInTx's cost against the hand-written
// BEGIN/UPDATE/COMMIT it replaces, on databases opened through lockhooks:
// how=manual is the hand-written transaction, how=runintx RunInTx with its
// defaults (on Postgres: one extra round trip per commit to read the
// transaction id, pg_current_xact_id_if_assigned(), so that a COMMIT cut
// off in flight can be resolved), how=runintx-skipcheck RunInTx with
// SkipCommitCheck.
func BenchmarkRunInTx(b *testing.B) {
	for _, bd := range benchDBs {
		for _, how := range []string{"manual", "runintx", "runintx-skipcheck"} {
			b.Run("db="+bd.name+"/how="+how, func(b *testing.B) {
				db := bd.open(b, viaLockhooks)
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
					if how == "manual" {
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
