package lockhooks

import (
	"context"
	"database/sql"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/pgtest"
)

// Token grows with every acquisition of one key, alternating between this
// process and a child process: directly, and through each PgBouncer of the
// test matrix in transaction mode (WithTransactionPooler, where the token
// is read on another server connection than the holder's). TryAdvisoryLock
// gets one too.
func TestTokenGrowsAcrossProcesses(t *testing.T) {
	run := func(t *testing.T, p *pgtest.Pooler) {
		dsn := pgtest.DSN(t)
		var opts []Option
		if p != nil {
			u, err := url.Parse(dsn)
			if err != nil {
				t.Fatal(err)
			}
			dsn = p.Reach(t, strings.TrimPrefix(u.Path, "/"))
			opts = append(opts, WithTransactionPooler())
		}
		db, err := Open("pgx", dsn, opts...)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		c := startChild(t, dsn, p != nil)
		ctx := context.Background()
		const key = 77
		var tokens []int64
		for i := range 4 {
			var l *AdvisoryLock
			if i%2 == 0 {
				l, err = AcquireAdvisoryLock(ctx, db, key)
			} else {
				var ok bool
				l, ok, err = TryAdvisoryLock(ctx, db, key)
				if err == nil && !ok {
					t.Fatal("TryAdvisoryLock of a free key: not acquired")
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			tokens = append(tokens, l.Token())
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
			theirs, err := strconv.ParseInt(c.ask(t, "token "+strconv.Itoa(key)), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			tokens = append(tokens, theirs)
		}
		for i := 1; i < len(tokens); i++ {
			if tokens[i] <= tokens[i-1] {
				t.Fatalf("tokens of successive acquisitions (this process, the child, …): %v; want each larger than the last", tokens)
			}
		}
		t.Logf("tokens: %v", tokens)
	}
	t.Run("direct", func(t *testing.T) { run(t, nil) })
	pgtest.EachPooler(t, run)
}

// The README's guarded write: a holder whose lock was lost (its backend
// terminated) and taken by another replica cannot overwrite the newer
// holder's write with its older token.
func TestTokenFencesAStaleHolder(t *testing.T) {
	dsn := pgtest.DSN(t)
	db, err := Open("pgx", dsn, WithLockCheckInterval(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	raw, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	mustExec(t, raw, "CREATE TABLE jobs (id int PRIMARY KEY, state text NOT NULL, fence bigint NOT NULL DEFAULT 0)")
	mustExec(t, raw, "INSERT INTO jobs (id, state) VALUES (1, 'new')")
	ctx := context.Background()
	const guarded = "UPDATE jobs SET state = $1, fence = $2 WHERE id = $3 AND fence < $2"
	write := func(q interface {
		ExecContext(context.Context, string, ...any) (sql.Result, error)
	}, state string, token int64) int64 {
		res, err := q.ExecContext(ctx, guarded, state, token, 1)
		if err != nil {
			t.Fatal(err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	old, err := AcquireAdvisoryLock(ctx, db, LockID("job-1"))
	if err != nil {
		t.Fatal(err)
	}
	if n := write(old.Conn(), "started by the old holder", old.Token()); n != 1 {
		t.Fatalf("the holder's guarded write updated %d rows", n)
	}
	// The old holder stalls; its backend is terminated, the lock is lost.
	mustExec(t, raw, "SELECT pg_terminate_backend($1)", old.c.pin.PID.Load())
	select {
	case <-old.Lost():
	case <-time.After(20 * time.Second):
		t.Fatal("the terminated holder's lock was not reported lost")
	}
	other, err := Open("pgx", dsn) // another replica
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	newer, err := AcquireAdvisoryLock(ctx, other, LockID("job-1"))
	if err != nil {
		t.Fatal(err)
	}
	defer newer.Release(ctx)
	if newer.Token() <= old.Token() {
		t.Fatalf("the new holder's token %d is not larger than the old one's %d", newer.Token(), old.Token())
	}
	if n := write(newer.Conn(), "done by the new holder", newer.Token()); n != 1 {
		t.Fatalf("the new holder's guarded write updated %d rows", n)
	}
	// The old holder wakes up and writes from elsewhere with its token.
	if n := write(raw, "overwritten by the stale holder", old.Token()); n != 0 {
		t.Fatalf("the stale holder's guarded write updated %d rows; want 0", n)
	}
	var state string
	if err := raw.QueryRow("SELECT state FROM jobs WHERE id = 1").Scan(&state); err != nil || state != "done by the new holder" {
		t.Fatalf("state %q (%v)", state, err)
	}
	old.Release(ctx)
}

// On SQLite the lock is in-process, and so is the token: it grows with
// each acquisition in the process (goroutines competing for one key), and
// starts from the clock.
func TestTokenGrowsInProcessOnSQLite(t *testing.T) {
	db, err := Open("sqlite", "file:"+filepath.Join(t.TempDir(), "t.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	start := time.Now().UnixNano()
	var mu sync.Mutex
	var tokens []int64
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for i := range 10 {
				var l *AdvisoryLock
				var err error
				if i%2 == 0 {
					l, err = AcquireAdvisoryLock(ctx, db, 5)
				} else {
					var ok bool
					for !ok && err == nil {
						l, ok, err = TryAdvisoryLock(ctx, db, 5)
					}
				}
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock() // under the advisory lock: the order of acquisitions
				tokens = append(tokens, l.Token())
				mu.Unlock()
				if err := l.Release(ctx); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if len(tokens) != 40 || tokens[0] < start {
		t.Fatalf("%d tokens, the first %d (the clock was %d before)", len(tokens), tokens[0], start)
	}
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Fatalf("token %d after %d: want each acquisition's larger", tokens[i], tokens[i-1])
		}
	}
}

// A hot standby takes advisory locks ("advisory locks work normally in
// recovery") but cannot assign a transaction id: AcquireAdvisoryLock and
// TryAdvisoryLock take the lock there, with Token 0, and Release frees it;
// RunInTx runs read-only work there (its commit path assigns no id either).
// The standby is real: pg_basebackup of the private cluster, streaming.
func TestAdvisoryLockOnHotStandby(t *testing.T) {
	dsn := pgtest.StandbyDSN(t)
	db, err := Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var recovering bool
	if err := db.QueryRowContext(ctx, "SELECT pg_is_in_recovery()").Scan(&recovering); err != nil || !recovering {
		t.Fatalf("the standby: pg_is_in_recovery() = %v, %v", recovering, err)
	}
	held := func(key int64) int {
		var n int
		if err := db.QueryRowContext(ctx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND objid = $1", key).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	l, err := AcquireAdvisoryLock(ctx, db, 4)
	if err != nil {
		t.Fatalf("AcquireAdvisoryLock on a hot standby: %v", err)
	}
	if l.Token() != 0 {
		t.Errorf("Token on a standby: %d, want 0 (no transaction id can be assigned)", l.Token())
	}
	if n := held(4); n != 1 {
		t.Errorf("pg_locks on the standby shows %d holds of key 4, want 1", n)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release on a standby: %v", err)
	}
	if n := held(4); n != 0 {
		t.Errorf("after Release pg_locks shows %d holds of key 4", n)
	}
	l, ok, err := TryAdvisoryLock(ctx, db, 5)
	if err != nil || !ok {
		t.Fatalf("TryAdvisoryLock on a standby: %v, %v", ok, err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, o := range []*sql.TxOptions{nil, {ReadOnly: true}, {Isolation: sql.LevelRepeatableRead, ReadOnly: true}} {
		if err := RunInTx(ctx, db, o, func(tx *sql.Tx) error {
			return tx.QueryRowContext(ctx, "SELECT 1").Scan(new(int))
		}); err != nil {
			t.Errorf("RunInTx %+v on a standby: %v", o, err)
		}
	}
}

// A role that may not call pg_current_xact_id(): the acquisition does not
// fail for the token, which is 0 (the lock statement that carries the
// token is refused before it runs, and the lock is then taken alone), and
// the database stops asking for it that way.
func TestTokenNotPermittedIsZero(t *testing.T) {
	dsn := pgtest.DSN(t)
	raw := openRaw(t, dsn)
	role := "token_" + strconv.FormatInt(time.Now().UnixNano()%1e9, 10)
	mustExec(t, raw, "CREATE ROLE "+role+" LOGIN")
	t.Cleanup(func() { raw.Exec("DROP ROLE " + role) })
	mustExec(t, raw, "REVOKE EXECUTE ON FUNCTION pg_current_xact_id() FROM PUBLIC") // (this test's database only)
	db := openDSN(t, withDSNParam(t, dsn, "user", role))
	ctx := context.Background()
	for i := range 2 {
		l, err := AcquireAdvisoryLock(ctx, db, 512)
		if err != nil {
			t.Fatalf("acquisition %d: %v", i, err)
		}
		if n := heldCount(t, raw, 512); n != 1 {
			t.Fatalf("acquisition %d: %d holders in pg_locks, want 1", i, n)
		}
		if l.Token() != 0 {
			t.Errorf("acquisition %d: token %d, want 0 (no permission to assign one)", i, l.Token())
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if n := heldCount(t, raw, 512); n != 0 {
			t.Fatalf("released: %d holders in pg_locks", n)
		}
	}
	tl, ok, err := TryAdvisoryLock(ctx, db, 513)
	if err != nil || !ok {
		t.Fatalf("TryAdvisoryLock: %v, %v; want the lock", ok, err)
	}
	if tl.Token() != 0 {
		t.Errorf("TryAdvisoryLock: token %d, want 0", tl.Token())
	}
	tl.Release(ctx)
}
