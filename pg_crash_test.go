package lockhooks

import (
	"database/sql"
	"fmt"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/pgtest"
)

// advisoryHolders returns the backends holding granted advisory locks on
// keys (bigint keys below 2^32) in raw's database, by key.
func advisoryHolders(t *testing.T, raw *sql.DB, keys ...int64) map[int64]int32 {
	t.Helper()
	var in []string
	for _, k := range keys {
		in = append(in, fmt.Sprint(k))
	}
	rows, err := raw.Query(`SELECT objid::bigint, pid FROM pg_locks
		WHERE locktype = 'advisory' AND classid = 0 AND objsubid = 1 AND granted
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND objid::bigint IN (` + strings.Join(in, ", ") + `)`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	held := map[int64]int32{}
	for rows.Next() {
		var k int64
		var pid int32
		if err := rows.Scan(&k, &pid); err != nil {
			t.Fatal(err)
		}
		held[k] = pid
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return held
}

// A process holding session locks that is killed with SIGKILL leaves none
// behind: directly (the backend sees its client's socket close and exits),
// and through PgBouncer in transaction mode with WithTransactionPooler
// (each lock is held inside a transaction on a holder connection, and
// PgBouncer closes the server connection of a client that disconnects
// inside a transaction, rather than give it to the next client). The child
// holds one AcquireAdvisoryLock and one lock parked on its pool; both are
// free within seconds of the kill, as pg_locks shows.
func TestKilledProcessLeavesNoLocks(t *testing.T) {
	run := func(t *testing.T, p *pgtest.Pooler) {
		direct := pgtest.DSN(t)
		raw, err := sql.Open("pgx", direct)
		if err != nil {
			t.Fatal(err)
		}
		defer raw.Close()
		dsn := direct
		if p != nil {
			u, err := url.Parse(direct)
			if err != nil {
				t.Fatal(err)
			}
			dsn = p.Reach(t, strings.TrimPrefix(u.Path, "/"))
		}
		c := startChild(t, dsn, p != nil)
		const k1, k2 = 4201, 4202
		c.ask(t, fmt.Sprintf("hold %d %d", k1, k2))
		held := advisoryHolders(t, raw, k1, k2)
		if len(held) != 2 {
			t.Fatalf("the child holds %v, want keys %d and %d", held, k1, k2)
		}
		if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-c.proc.Exited()
		killed := time.Now()
		// Polling pg_locks with a deadline; the bound is generous for a
		// loaded machine: the locks go within milliseconds.
		waitFor(t, 10*time.Second, "the killed child's locks to be freed", func() bool {
			return len(advisoryHolders(t, raw, k1, k2)) == 0
		})
		t.Logf("the killed child's locks were free %v after SIGKILL (held by backends %v)", time.Since(killed).Round(time.Millisecond), held)
		// Freed because their backends ended: PgBouncer closed the server
		// connections whose clients left inside a transaction.
		for _, pid := range held {
			waitFor(t, 10*time.Second, "the killed child's backends to end", func() bool { return !backendAlive(t, raw, pid) })
		}
	}
	t.Run("direct", func(t *testing.T) { run(t, nil) })
	pgtest.EachPooler(t, run)
}
