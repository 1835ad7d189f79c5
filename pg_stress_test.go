package lockhooks

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/pgtest"
)

// Environment of the helper process that plays another replica.
const (
	envHelperDSN   = "LOCKHOOKS_HELPER_DSN"
	envHelperIters = "LOCKHOOKS_HELPER_ITERS"
)

const stressKeyName = "stress-counter"

// incrementUnderLock does iters read-then-write increments of the counter,
// each under AcquireAdvisoryLock; without the lock they would lose updates.
func incrementUnderLock(ctx context.Context, db *sql.DB, iters int) error {
	for range iters {
		l, err := AcquireAdvisoryLock(ctx, db, LockID(stressKeyName))
		if err != nil {
			return err
		}
		var n int
		c := l.Conn()
		if err := c.QueryRowContext(ctx, "SELECT n FROM counter WHERE id = 1").Scan(&n); err != nil {
			l.Release(ctx)
			return err
		}
		if _, err := c.ExecContext(ctx, "UPDATE counter SET n = $1 WHERE id = 1", n+1); err != nil {
			l.Release(ctx)
			return err
		}
		if err := l.Release(ctx); err != nil {
			return err
		}
	}
	return nil
}

// TestHelperReplica is not a test: it is the body of the replica processes
// TestAdvisoryLockMutualExclusion starts.
func TestHelperReplica(t *testing.T) {
	dsn := os.Getenv(envHelperDSN)
	if dsn == "" {
		t.Skip("runs only as a helper process of TestAdvisoryLockMutualExclusion")
	}
	iters, _ := strconv.Atoi(os.Getenv(envHelperIters))
	db, err := Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for range 2 {
		wg.Go(func() { errs <- incrementUnderLock(ctx, db, iters) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

// Goroutines of this process and three other processes (replicas) increment
// one counter under AcquireAdvisoryLock: the count is exact, and no lock is
// left behind.
func TestAdvisoryLockMutualExclusion(t *testing.T) {
	const (
		processes  = 3
		goroutines = 4
		iters      = 25
	)
	dsn := pgtest.DSN(t)
	db, err := Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	mustExec(t, db, "CREATE TABLE counter (id int PRIMARY KEY, n int NOT NULL); INSERT INTO counter VALUES (1, 0)")

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, processes+goroutines)
	for i := range processes {
		ch := startTestChild(t, "TestHelperReplica", envHelperDSN+"="+dsn, envHelperIters+"="+strconv.Itoa(iters))
		wg.Go(func() {
			var out strings.Builder
			for line := range ch.lines { // to its end: the child has closed its stdout
				out.WriteString(line + "\n")
			}
			select {
			case <-ch.proc.Exited():
				if err := ch.proc.Err(); err != nil {
					errs <- fmt.Errorf("replica %d: %v\n%s%s", i, err, out.String(), ch.stderr.String())
				}
			case <-ctx.Done():
				errs <- fmt.Errorf("replica %d: still running after its stdout closed: %v", i, ctx.Err())
			}
		})
	}
	for range goroutines {
		wg.Go(func() {
			if err := incrementUnderLock(ctx, db, iters); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	var n int
	if err := db.QueryRow("SELECT n FROM counter WHERE id = 1").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if want := processes*2*iters + goroutines*iters; n != want {
		t.Errorf("counter = %d, want %d: the lock did not exclude", n, want)
	}
	var left int
	if err := db.QueryRow("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("%d advisory locks left in pg_locks", left)
	}
}
