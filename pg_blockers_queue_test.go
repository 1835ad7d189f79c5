package lockhooks

import (
	"context"
	"database/sql"
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/pgserver"
	"github.com/lockhooks/lockhooks/internal/pgtest"
)

// queueEnv is a queue of server waiters on one advisory key: an outside
// session (raw pgx, not lockhooks) holds the key and n connections of a
// lockhooks pool wait for it in SELECT pg_advisory_lock. The key is a pair
// of int4 keys (queueClass, key): a statement of one bigint key waits for
// its turn in memory first (internal/pgstmt's turns.go), one connection per key on the
// server, and a queue on the server is what other processes, or other
// forms of the call, make.
type queueEnv struct {
	db, raw *sql.DB
	c       *connector
	key     int64
	holder  int32 // the outside session's backend
	waiters []int32
	done    chan error
	unlock  func()
}

// queueOnKey sets up the queue of n waiters and waits until pg_locks shows
// them all waiting.
func queueOnKey(t testing.TB, n int, opts ...Option) *queueEnv {
	t.Helper()
	dsn := pgtest.DSN(t)
	e := &queueEnv{db: openDSN(t, dsn, opts...), raw: openRaw(t, dsn), key: 7301, done: make(chan error, n)}
	e.db.SetMaxOpenConns(n + 2)
	e.c = connectorOf(t, e.db)
	ctx := context.Background()
	hc, pid := rawBlockerOf(t, e.raw, queueLock, e.key, "queue")
	e.holder = pid
	e.unlock = func() {
		hc.ExecContext(ctx, "SELECT "+queueUnlock, e.key)
		hc.Close()
	}
	for range n {
		go func() {
			e.done <- lockOnOwnConn(ctx, e.db, e.key)
		}()
	}
	waitFor(t, 30*time.Second, fmt.Sprintf("%d backends waiting for key %d", n, e.key), func() bool {
		rows, err := e.raw.Query(`SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND classid = `+queueClass+` AND objid = $1 ORDER BY pid`, e.key)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		e.waiters = e.waiters[:0]
		for rows.Next() {
			var p int32
			rows.Scan(&p)
			e.waiters = append(e.waiters, p)
		}
		return len(e.waiters) == n
	})
	return e
}

// lockOnOwnConn waits for the queue's key on a connection of db's pool,
// then unlocks it there.
func lockOnOwnConn(ctx context.Context, db *sql.DB, key int64) error {
	return lockUnlockOnConn(ctx, db, queueLock, queueUnlock, key)
}

// lockUnlockOnConn runs SELECT lock, then SELECT unlock (each with key as
// $1) on one connection of db's pool.
func lockUnlockOnConn(ctx context.Context, db *sql.DB, lock, unlock string, key int64) error {
	c, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.ExecContext(ctx, "SELECT "+lock, key); err != nil {
		return err
	}
	_, err = c.ExecContext(ctx, "SELECT "+unlock, key)
	return err
}

// The queue's key: the pair (queueClass, key).
const (
	queueClass  = "73"
	queueLock   = "pg_advisory_lock(" + queueClass + ", $1::int)"
	queueUnlock = "pg_advisory_unlock(" + queueClass + ", $1::int)"
)

// finish releases the outside lock, waits for every waiter to take and
// release the key, closes the pool and checks that no advisory lock is
// left.
func (e *queueEnv) finish(t testing.TB) {
	t.Helper()
	e.unlock()
	for range len(e.waiters) {
		select {
		case err := <-e.done:
			if err != nil {
				t.Errorf("waiter: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("waiters did not get the key after the unlock")
		}
	}
	e.db.Close()
	waitFor(t, 10*time.Second, "no advisory lock left", func() bool {
		var n int
		if err := e.raw.QueryRow("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
}

// A queue of 40 and of 200 server waiters on one key held outside
// lockhooks: one read names, for every waiter, the outside session as the
// holder at the root (not waiting, depth 1) and the waiters queued ahead of
// it as queued (waiting), within the time the read is allowed, and so does
// the page.
func TestBlockersQueueNamesTheHolder(t *testing.T) {
	for _, n := range []int{40, 200} {
		t.Run(fmt.Sprint("waiters=", n), func(t *testing.T) {
			e := queueOnKey(t, n)
			defer e.finish(t)
			start := time.Now()
			blocked, err := e.c.Blocking.Blocked(context.Background(), e.c.Conns())
			took := time.Since(start)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%d waiters read in %v", n, took)
			if len(blocked) != n {
				t.Fatalf("%d blocked connections read, want %d", len(blocked), n)
			}
			positions := map[int]bool{} // each waiter's number of waiters queued ahead: 0, 1, …, n-1
			for oc, bb := range blocked {
				positions[bb.QueuedAhead] = true
				if len(bb.Blockers) == 0 || bb.Blockers[0].PID != e.holder || bb.Blockers[0].Waiting || bb.Blockers[0].Depth != 1 {
					t.Fatalf("connection #%d (pid %d): blockers %+v, want the outside holder %d first", oc.id, bb.PID, bb.Blockers, e.holder)
				}
				if len(bb.Blockers) > 1 {
					if x := bb.Blockers[1]; !x.Waiting || x.PID == e.holder || x.PID == bb.PID {
						t.Errorf("connection #%d (pid %d): second blocker %+v is not one queued ahead", oc.id, bb.PID, x)
					}
				}
				if len(bb.Blockers) > pgserver.MaxQueuedListed+1 {
					t.Errorf("connection #%d: %d blockers listed, more than the holder and %d queued ahead", oc.id, len(bb.Blockers), pgserver.MaxQueuedListed)
				}
				if want := min(bb.QueuedAhead, pgserver.MaxQueuedListed) + 1; len(bb.Blockers) != want {
					t.Errorf("connection #%d: %d blockers listed with %d queued ahead, want %d", oc.id, len(bb.Blockers), bb.QueuedAhead, want)
				}
			}
			for i := range n {
				if !positions[i] {
					t.Fatalf("no waiter has %d queued ahead of it: the queue positions read are %v", i, positions)
				}
			}

			srv := httptest.NewServer(DebugHandler(e.db))
			defer srv.Close()
			rep, _ := debugJSON(t, srv)
			d := rep.Databases[0]
			if len(d.Waiters) != n {
				t.Fatalf("page: %d waiters, want %d; notes %v", len(d.Waiters), n, d.Notes)
			}
			pagePositions := map[int]bool{}
			for _, w := range d.Waiters {
				if len(w.Blockers) == 0 || w.Blockers[0].PID != e.holder || w.Blockers[0].Waiting {
					t.Fatalf("page: waiter conn #%d names %+v, want the outside holder %d first; notes %v", w.Conn, w.Blockers, e.holder, d.Notes)
				}
				queued := 0 // the waiters queued ahead are connections of the database: holders, queued
				for _, h := range w.Holders {
					if !h.Queued || h.Conn == 0 || h.Conn == w.Conn {
						t.Errorf("page: waiter conn #%d names holder %+v, want only connections queued ahead", w.Conn, h)
					}
					queued++
				}
				if want := min(w.QueuedAhead, pgserver.MaxQueuedListed); len(w.Blockers) != 1 || queued != want {
					t.Errorf("page: waiter conn #%d lists %d blockers and %d queued holders with %d queued ahead, want 1 and %d",
						w.Conn, len(w.Blockers), queued, w.QueuedAhead, want)
				}
				pagePositions[w.QueuedAhead] = true
			}
			if len(pagePositions) != n {
				t.Errorf("page: %d distinct queue positions among %d waiters", len(pagePositions), n)
			}
		})
	}
}

// BenchmarkBlockersQueue times one read of who blocks whom with a queue of
// server waiters on one key held by an outside session.
func BenchmarkBlockersQueue(b *testing.B) {
	for _, n := range []int{40, 200} {
		b.Run(fmt.Sprint("waiters=", n), func(b *testing.B) {
			e := queueOnKey(b, n)
			defer e.finish(b)
			conns := e.c.Conns()
			b.ResetTimer()
			for b.Loop() {
				blocked, err := e.c.Blocking.Blocked(context.Background(), conns)
				if err != nil {
					b.Fatal(err)
				}
				if len(blocked) != n {
					b.Fatalf("%d blocked, want %d", len(blocked), n)
				}
			}
		})
	}
}
