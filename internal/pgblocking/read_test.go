package pgblocking

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
	"github.com/lockhooks/lockhooks/internal/pgdriver"
	"github.com/lockhooks/lockhooks/internal/pgserver"
	"github.com/lockhooks/lockhooks/internal/pgtest"
	"github.com/lockhooks/lockhooks/internal/rawconn"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// serverEnv opens a database for t, runs setup there, and returns a pool
// on it, for acting beside the reader, and a reader on a side connection
// of its own over the connections conns returns (nil: none).
func serverEnv(t *testing.T, setup string, conns func() []*testConn) (context.Context, *sql.DB, *Reader[*testConn]) {
	t.Helper()
	dsn := pgtest.DSN(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	raw, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	if setup != "" {
		if _, err := raw.ExecContext(ctx, setup); err != nil {
			t.Fatal(err)
		}
	}
	side := rawconn.NewSide(func(context.Context) (driver.Conn, error) { return stdlib.GetDefaultDriver().Open(dsn) })
	t.Cleanup(side.Close)
	if conns == nil {
		conns = func() []*testConn { return nil }
	}
	return ctx, raw, New(Config[*testConn]{Side: side, Own: &pgdriver.Statements{}, Database: func() uint64 { return 1 }, SeenBy: "db",
		Conns: conns, Timeout: 10 * time.Second})
}

// A real queue: an outside session holds advisory key 1, two connections
// of the database wait for it, one behind the other. The read names the
// holder first for both, the first waiter as queued ahead of the second;
// overlapping reads share one; and the key's holder is read from pg_locks.
func TestBlockedReadsTheQueueToItsHolder(t *testing.T) {
	var mu sync.Mutex
	var conns []*testConn
	ctx, raw, r := serverEnv(t, "", func() []*testConn { mu.Lock(); defer mu.Unlock(); return append([]*testConn(nil), conns...) })
	holder, err := raw.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	var holderPID int32
	if err := holder.QueryRowContext(ctx, "SELECT pg_backend_pid(), pg_advisory_lock(1)").Scan(&holderPID, new(any)); err != nil {
		t.Fatal(err)
	}

	var wg sync.WaitGroup
	defer wg.Wait()
	waitFor := func(id uint64) *testConn {
		c, err := raw.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		tc := &testConn{id: id}
		if err := c.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&tc.pid); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		conns = append(conns, tc)
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			c.ExecContext(ctx, "SELECT pg_advisory_lock(1)") // until the holder's unlock below
			c.ExecContext(ctx, "SELECT pg_advisory_unlock(1)")
		}()
		for { // until the server shows it waiting
			got, err := r.Blocked(ctx, []*testConn{tc})
			if err != nil {
				t.Fatal(err)
			}
			if got[tc] != nil {
				return tc
			}
			if ctx.Err() != nil {
				t.Fatalf("connection %d never showed as waiting", id)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	first, second := waitFor(1), waitFor(2)

	// Several readers at once share reads, and all see the same.
	var readers sync.WaitGroup
	results := make([]map[*testConn]*Wait, 8)
	for i := range results {
		readers.Add(1)
		go func() {
			defer readers.Done()
			results[i], _ = r.Blocked(ctx, []*testConn{first, second})
		}()
	}
	readers.Wait()
	for i, got := range results {
		f, s := got[first], got[second]
		if f == nil || s == nil {
			t.Fatalf("read %d: %v", i, got)
		}
		if f.PID != first.pid || len(f.Blockers) != 1 || f.Blockers[0].PID != holderPID || f.QueuedAhead != 0 || f.Blockers[0].SeenBy != "db" {
			t.Errorf("read %d: the first waiter %+v, want only holder %d", i, f, holderPID)
		}
		if s.PID != second.pid || s.QueuedAhead != 1 || len(s.Blockers) != 2 || s.Blockers[0].PID != holderPID || s.Blockers[1].PID != first.pid || !s.Blockers[1].Waiting {
			t.Errorf("read %d: the second waiter %+v, want holder %d then %d queued", i, s, holderPID, first.pid)
		}
		if s.WaitEvent != "Lock/advisory" || s.WaitSeconds < 0 || len(s.Blockers) > pgserver.MaxQueuedListed+1 {
			t.Errorf("read %d: %+v", i, s)
		}
	}

	held := r.KeyHolders(ctx, 0, []advisorykey.Key{{K1: 1}})
	if len(held) != 1 || held[0].PID != holderPID {
		t.Errorf("holders of key 1: %+v, want backend %d", held, holderPID)
	}
	if held := r.KeyHolders(ctx, holderPID, []advisorykey.Key{{K1: 1}}); len(held) != 0 {
		t.Errorf("holders of key 1 but %d: %+v", holderPID, held)
	}

	if _, err := holder.ExecContext(ctx, "SELECT pg_advisory_unlock(1)"); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	var left int
	if err := raw.QueryRowContext(ctx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").Scan(&left); err != nil || left != 0 {
		t.Errorf("advisory locks left: %d, %v", left, err)
	}
	if got, err := r.Blocked(ctx, []*testConn{first, second}); err != nil || len(got) != 0 {
		t.Errorf("after the holder's unlock: %v, %v", got, err)
	}
}
