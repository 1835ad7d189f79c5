package lockhooks

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/pgtest"
)

// mixedLoad is the load that deadlocked the pool: workers on one database
// of poolSize connections mix AcquireAdvisoryLock with a protected UPDATE,
// RunInTx transfers under Lock, TryAdvisoryLock, and (raw, three workers in
// four) the seed's pattern through the pool: a lock statement, another statement, and the
// unlock, each on whatever connection the pool hands out. The unlock of a
// raw lock needs a pool connection while its holder is parked; with every
// connection waiting for such a lock, nobody could send it.
type mixedLoad struct {
	workers, poolSize int
	raw               bool
	keys              int // advisory keys 9100…, one counter row each
	accounts          int
}

// mixedResult is what a run of mixedLoad did.
type mixedResult struct {
	ops, gaveWay, tryMissed int64
	slowest                 time.Duration
	slowestOp               string
	errs                    []error
}

// stallLimit is how long any one operation of the load may take.
const stallLimit = 2 * time.Second

func (m mixedLoad) setup(t testing.TB, raw *sql.DB) {
	t.Helper()
	mustExec(t, raw, "CREATE TABLE jobs (id bigint PRIMARY KEY, n bigint NOT NULL)")
	mustExec(t, raw, "CREATE TABLE accts (id int PRIMARY KEY, bal bigint NOT NULL)")
	mustExec(t, raw, fmt.Sprintf("INSERT INTO jobs SELECT 9100 + g, 0 FROM generate_series(0, %d) g", m.keys-1))
	mustExec(t, raw, fmt.Sprintf("INSERT INTO accts SELECT g, 1000 FROM generate_series(1, %d) g", m.accounts))
}

// run runs the load on db for d, counting acknowledged increments per key
// in acked.
func (m mixedLoad) run(db *sql.DB, d time.Duration, acked []atomic.Int64) mixedResult {
	var res mixedResult
	var mu sync.Mutex
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	for w := range m.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 29))
			for time.Now().Before(deadline) {
				// Three workers in four send the raw pattern: more raw waits
				// than the pool has connections, as at the incident.
				pattern := rng.IntN(3)
				if m.raw && w%4 != 0 {
					pattern = 3
				}
				ki := rng.IntN(m.keys)
				key := int64(9100 + ki)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				start := time.Now()
				name, err := m.op(ctx, db, pattern, key, ki, rng, acked, &res)
				took := time.Since(start)
				cancel()
				mu.Lock()
				res.ops++
				if took > res.slowest {
					res.slowest, res.slowestOp = took, name
				}
				if err != nil && len(res.errs) < 20 {
					res.errs = append(res.errs, fmt.Errorf("%s on key %d after %v: %w", name, key, took.Round(time.Millisecond), err))
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return res
}

// op runs one operation of the load.
func (m mixedLoad) op(ctx context.Context, db *sql.DB, pattern int, key int64, ki int, rng *rand.Rand, acked []atomic.Int64, res *mixedResult) (string, error) {
	switch pattern {
	case 0:
		l, err := AcquireAdvisoryLock(ctx, db, key)
		if err != nil {
			return "AcquireAdvisoryLock", err
		}
		_, err = l.Conn().ExecContext(ctx, "UPDATE jobs SET n = n + 1 WHERE id = $1", key)
		if rerr := l.Release(ctx); err == nil && rerr != nil {
			return "Release", rerr
		}
		if err == nil {
			acked[ki].Add(1)
		}
		return "AcquireAdvisoryLock", err
	case 1:
		a := 1 + rng.IntN(m.accounts)
		b := 1 + (a+rng.IntN(m.accounts-1))%m.accounts
		return "RunInTx transfer", RunInTx(ctx, db, nil, func(tx *sql.Tx) error {
			if err := Lock(ctx, tx, "acct", a, b); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, "UPDATE accts SET bal = bal - 1 WHERE id = $1", a); err != nil {
				return err
			}
			_, err := tx.ExecContext(ctx, "UPDATE accts SET bal = bal + 1 WHERE id = $1", b)
			return err
		})
	case 2:
		l, ok, err := TryAdvisoryLock(ctx, db, key)
		if err != nil || !ok {
			if err == nil {
				atomic.AddInt64(&res.tryMissed, 1)
			}
			return "TryAdvisoryLock", err
		}
		_, err = l.Conn().ExecContext(ctx, "UPDATE jobs SET n = n + 1 WHERE id = $1", key)
		if rerr := l.Release(ctx); err == nil && rerr != nil {
			return "Release", rerr
		}
		if err == nil {
			acked[ki].Add(1)
		}
		return "TryAdvisoryLock", err
	default:
		if _, err := db.ExecContext(ctx, "SELECT pg_advisory_lock($1)", key); err != nil {
			if errors.Is(err, ErrPoolDeadlock) {
				atomic.AddInt64(&res.gaveWay, 1)
				return "raw lock", nil
			}
			return "raw lock", err
		}
		var one int
		err := db.QueryRowContext(ctx, "SELECT 1").Scan(&one)
		var ok bool
		if uerr := db.QueryRowContext(ctx, "SELECT pg_advisory_unlock($1)", key).Scan(&ok); uerr != nil || !ok {
			return "raw unlock", fmt.Errorf("unlock = %v, %v", ok, uerr)
		}
		return "raw lock, SELECT 1, unlock", err
	}
}

// Issue: the process deadlocked itself under this load. 32 workers, 16
// connections, the four patterns, for a minute (5 s with -short): no
// operation stalls past 2 s, every acknowledged increment is in the table,
// the balances are conserved, and after db.Close no lock, backend or
// goroutine is left, and the live heap did not grow.
func TestPoolNeverDeadlocksItselfUnderMixedLoad(t *testing.T) {
	d := time.Minute
	if testing.Short() {
		d = 5 * time.Second
	}
	m := mixedLoad{workers: 32, poolSize: 16, raw: true, keys: 8, accounts: 10}
	dsn := pgtest.DSN(t)
	raw, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	m.setup(t, raw)
	var dbName string
	if err := raw.QueryRow("SELECT current_database()").Scan(&dbName); err != nil {
		t.Fatal(err)
	}
	baseGoroutines := runtime.NumGoroutine()
	log := &syncBuffer{}
	db, err := Open("pgx", dsn, WithLogger(slog.New(slog.NewTextHandler(log, nil))))
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(m.poolSize)
	acked := make([]atomic.Int64, m.keys)

	// A warm-up third, then the heap is measured, then the rest.
	first := m.run(db, d/3, acked)
	heapAfterWarmUp := liveHeap()
	rest := m.run(db, d-d/3, acked)
	heapAtEnd := liveHeap()
	res := first
	res.ops += rest.ops
	res.gaveWay += rest.gaveWay
	res.tryMissed += rest.tryMissed
	res.errs = append(res.errs, rest.errs...)
	if rest.slowest > res.slowest {
		res.slowest, res.slowestOp = rest.slowest, rest.slowestOp
	}
	t.Logf("%d operations in %v (%.0f/s), %d raw lock statements gave their connection up (ErrPoolDeadlock), %d try-locks missed; slowest: %s, %v",
		res.ops, d, float64(res.ops)/d.Seconds(), res.gaveWay, res.tryMissed, res.slowestOp, res.slowest.Round(time.Millisecond))
	for _, err := range res.errs {
		t.Errorf("operation failed: %v", err)
	}
	if res.slowest > stallLimit {
		t.Errorf("%s took %v, over %v: the load stalled\nlog:\n%s", res.slowestOp, res.slowest.Round(time.Millisecond), stallLimit, tail(log.String(), 4000))
	}

	var want, got int64
	for i := range acked {
		want += acked[i].Load()
	}
	if err := raw.QueryRow("SELECT sum(n) FROM jobs").Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Errorf("the table has %d increments, %d were acknowledged", got, want)
	}
	var bal int64
	if err := raw.QueryRow("SELECT sum(bal) FROM accts").Scan(&bal); err != nil {
		t.Fatal(err)
	}
	if bal != int64(1000*m.accounts) {
		t.Errorf("balances sum to %d, want %d", bal, 1000*m.accounts)
	}
	if grow := heapAtEnd - heapAfterWarmUp; grow > 8<<20 {
		t.Errorf("the live heap grew by %d bytes from the first third to the end (%d to %d)", grow, heapAfterWarmUp, heapAtEnd)
	}

	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "no backend of the database but ours, and no advisory lock", func() bool {
		var backends, locks int
		if err := raw.QueryRow("SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()", dbName).Scan(&backends); err != nil {
			t.Fatal(err)
		}
		if err := raw.QueryRow("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").Scan(&locks); err != nil {
			t.Fatal(err)
		}
		return backends <= 1 && locks == 0 // (raw's own pool may hold a second idle connection)
	})
	waitFor(t, 10*time.Second, "goroutines back to their baseline", func() bool { return runtime.NumGoroutine() <= baseGoroutines+2 })
}

// liveHeap is the heap in use after a collection.
func liveHeap() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// tail is the last n bytes of s.
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := strings.IndexByte(s[len(s)-n:], '\n')
	return s[len(s)-n+i+1:]
}

// BenchmarkMixedLoad reports the throughput of the mixed load, with and
// without the raw pattern (each iteration is a 5 s run).
func BenchmarkMixedLoad(b *testing.B) {
	for _, withRaw := range []bool{false, true} {
		b.Run(fmt.Sprintf("raw=%v", withRaw), func(b *testing.B) {
			m := mixedLoad{workers: 32, poolSize: 16, raw: withRaw, keys: 8, accounts: 10}
			dsn := pgtest.DSN(b)
			raw, err := sql.Open("pgx", dsn)
			if err != nil {
				b.Fatal(err)
			}
			defer raw.Close()
			m.setup(b, raw)
			db, err := Open("pgx", dsn, WithLogger(slog.New(slog.DiscardHandler)))
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			db.SetMaxOpenConns(m.poolSize)
			acked := make([]atomic.Int64, m.keys)
			var ops, gave int64
			var elapsed time.Duration
			b.ResetTimer()
			for range b.N {
				start := time.Now()
				res := m.run(db, 5*time.Second, acked)
				elapsed += time.Since(start)
				ops += res.ops
				gave += res.gaveWay
				for _, err := range res.errs {
					b.Error(err)
				}
			}
			b.ReportMetric(float64(ops)/elapsed.Seconds(), "ops/s")
			b.ReportMetric(float64(gave)/float64(max(ops, 1)), "gave-way/op")
			// Connections opened per operation: a raw lock parks its
			// connection, and the unlock then closes it (it holds nothing).
			b.ReportMetric(float64(connectorOf(b, db).nextID.Load())/float64(max(ops, 1)), "conns/op")
		})
	}
}
