package lockhooks

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/lockhooks/lockhooks/internal/pgtest"
)

// stallingConnector makes new connections hang until their context ends
// once stall is set, as a server that stopped answering does; stalled
// counts the connections hanging.
type stallingConnector struct {
	driver.Connector
	stall   *atomic.Bool
	stalled *atomic.Int32
}

func (s stallingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	if s.stall.Load() {
		s.stalled.Add(1)
		defer s.stalled.Add(-1)
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return s.Connector.Connect(ctx)
}

// db.Close returns promptly while the slow-wait log is looking up the
// holders of several waits on a server that stopped answering: each lookup
// would wait for its side connection up to blockerLookupTimeout, one after
// the other; close cancels them.
func TestCloseDoesNotWaitForHolderLookups(t *testing.T) {
	cfg, err := pgx.ParseConfig(pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	var stall atomic.Bool
	var stalled atomic.Int32
	db := sql.OpenDB(WrapConnector(stallingConnector{stdlib.GetConnector(*cfg), &stall, &stalled},
		WithDialect(Postgres), WithSlowLockLog(100*time.Millisecond)))
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := AcquireAdvisoryLock(ctx, db, 5); err != nil {
		t.Fatal(err)
	}
	const n = 4
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() { AcquireAdvisoryLock(wctx, db, 5) })
	}
	waitFor(t, 10*time.Second, "the waits to be listed", func() bool { return len(connectorOf(t, db).Waits.List()) == n })
	stall.Store(true)
	waitFor(t, 10*time.Second, "a holder lookup to hang on the silent server", func() bool { return stalled.Load() > 0 })
	start := time.Now()
	db.Close()
	took := time.Since(start)
	wcancel()
	wg.Wait()
	// Before, close waited for every lookup in turn: n × 2s.
	if took > blockerLookupTimeout {
		t.Fatalf("db.Close took %v with holder lookups hanging; want it not to wait for them", took)
	}
}
