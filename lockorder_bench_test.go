package lockhooks

import (
	"context"
	"testing"
)

// BenchmarkLockOrderSession is the lock-order checker's cost on the path
// of session advisory locks (Postgres): a session lock, a transaction
// that takes a transaction advisory lock while the session lock is held,
// and the unlock, on one connection. check=on records the session class,
// its call stack and the order edge (known after the first iteration).
func BenchmarkLockOrderSession(b *testing.B) {
	for _, check := range []string{"off", "on"} {
		b.Run("check="+check, func(b *testing.B) {
			var opts []Option
			if check == "on" {
				opts = append(opts, WithLockOrderCheck(func(r LockOrderReport) { b.Fatalf("unexpected report: %v", r) }))
			}
			db := openPG(b, opts...)
			db.SetMaxOpenConns(1)
			ctx := context.Background()
			conn, err := db.Conn(ctx)
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				mustExec(b, conn, "SELECT pg_advisory_lock(7)")
				tx, err := conn.BeginTx(ctx, nil)
				if err != nil {
					b.Fatal(err)
				}
				mustExec(b, tx, "SELECT pg_advisory_xact_lock(8)")
				if err := tx.Commit(); err != nil {
					b.Fatal(err)
				}
				mustExec(b, conn, "SELECT pg_advisory_unlock(7)")
			}
		})
	}
}
