package lockhooks

import (
	"context"
	"database/sql"
	"testing"

	"github.com/lockhooks/lockhooks/internal/pgtest"
)

// BenchmarkTransactionIdentity is what publishing a transaction's identity
// costs: BeginTx, one UPDATE, Commit on one connection, through pgx alone
// (driver=raw), through lockhooks on a database whose DSN names the
// application (identity=off: the driver's own BEGIN and COMMIT, as before
// identities), and through lockhooks publishing the identity (identity=on:
// lockhooks' BEGIN sets a transaction-local application_name in the same
// message). The round trips are the same (TestIdentityNoExtraRoundTrip);
// the difference is the server's work on the longer messages, pgx reading
// two ParameterStatus messages, and the call-site lookup at BeginTx.
// how=runintx is RunInTx with its defaults running the same work (its
// BEGIN message also reads the transaction id).
func BenchmarkTransactionIdentity(b *testing.B) {
	dsn := pgtest.DSN(b)
	raw, err := sql.Open("pgx", dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer raw.Close()
	mustExec(b, raw, "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL); INSERT INTO t VALUES (1, 0)")
	for _, w := range []openedAs{
		{"driver=raw", func() (*sql.DB, error) { return sql.Open("pgx", dsn) }},
		{"driver=lockhooks/identity=off", func() (*sql.DB, error) { return Open("pgx", withDSNParam(b, dsn, "application_name", "bench")) }},
		{"driver=lockhooks/identity=on", func() (*sql.DB, error) { return Open("pgx", dsn) }},
	} {
		for _, how := range []string{"manual", "runintx"} {
			if how == "runintx" && w.name == "driver=raw" {
				continue
			}
			b.Run(w.name+"/how="+how, func(b *testing.B) {
				db := w.openOne(b)
				ctx := context.Background()
				work := func(tx *sql.Tx) error {
					_, err := tx.ExecContext(ctx, "UPDATE t SET v = v + 1 WHERE id = $1", 1)
					return err
				}
				b.ReportAllocs()
				for b.Loop() {
					var err error
					if how == "manual" {
						err = manualTx(ctx, db, work)
					} else {
						err = RunInTx(ctx, db, nil, work)
					}
					if err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
