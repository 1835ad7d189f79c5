package lockhooks

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/pgtest"
)

// Lock statements of one bigint key wait for their turn in memory, behind
// the one connection of the database that waits on the server: the model
// never names that waiting connection as the holder. Every waiter, on the
// page and in the slow-wait log, names the outside session that holds the
// key, with the connection ahead of it queued.
func TestTurnQueueWaitersNameTheRealHolder(t *testing.T) {
	const n, key = 8, 7311
	dsn := pgtest.DSN(t)
	log := &syncBuffer{}
	db := openDSN(t, dsn, slowLogOptions(log, 50*time.Millisecond)...)
	db.SetMaxOpenConns(n + 2)
	raw := openRaw(t, dsn)
	hc, holder := rawBlocker(t, raw, key, "turns")
	done := make(chan error, n)
	for range n {
		go func() {
			done <- lockUnlockOnConn(context.Background(), db, "pg_advisory_lock($1)", "pg_advisory_unlock($1)", key)
		}()
	}
	c := connectorOf(t, db)
	waitFor(t, 30*time.Second, fmt.Sprintf("one server waiter and %d in memory", n-1), func() bool {
		inMemory := 0
		for _, e := range c.Turns.Entries() {
			inMemory += len(e.Waiters)
		}
		var onServer int
		if err := raw.QueryRow("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND objid = $1", key).Scan(&onServer); err != nil {
			t.Fatal(err)
		}
		return inMemory == n-1 && onServer == 1
	})

	srv := httptest.NewServer(DebugHandler(db))
	defer srv.Close()
	rep, _ := debugJSON(t, srv)
	d := rep.Databases[0]
	if len(d.Waiters) != n {
		t.Fatalf("page: %d waiters, want %d; notes %v", len(d.Waiters), n, d.Notes)
	}
	for _, w := range d.Waiters {
		if len(w.Blockers) == 0 || w.Blockers[0].PID != holder || w.Blockers[0].Waiting {
			t.Errorf("page: waiter conn #%d names blockers %+v and holders %+v, want the outside holder %d first", w.Conn, w.Blockers, w.Holders, holder)
		}
		for _, h := range w.Holders {
			if !h.Queued {
				t.Errorf("page: waiter conn #%d names connection #%d as a holder that is not queued: a waiter shown as the holder", w.Conn, h.Conn)
			}
		}
	}
	waitFor(t, 20*time.Second, "every wait to log its holder", func() bool {
		return strings.Count(log.String(), fmt.Sprintf("holder_pid=%d", holder)) >= n
	})
	hc.ExecContext(context.Background(), "SELECT pg_advisory_unlock($1)", key)
	hc.Close()
	for range n {
		select {
		case err := <-done:
			if err != nil {
				t.Error(err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the waiters did not get the key after the unlock")
		}
	}
}
