package lockhooks

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/debugpage"
	"github.com/lockhooks/lockhooks/internal/pgtest"
	"github.com/lockhooks/lockhooks/internal/rawconn"
)

// rawApp is the application_name of the tests' raw sessions (openRawApp).
const rawApp = "lockhooks_test_raw"

// openRawApp opens dsn through pgx alone, its sessions named rawApp.
func openRawApp(t testing.TB, dsn string) *sql.DB {
	return openRaw(t, withDSNParam(t, dsn, "application_name", rawApp))
}

// lockhooksBackends counts the client backends of raw's database other
// than raw's own sessions (rawApp, and the outside holder's
// lockhooks_debug_blocker) and the except pids.
func lockhooksBackends(t testing.TB, raw *sql.DB, except ...int32) int {
	t.Helper()
	ex := []string{"0"}
	for _, p := range except {
		ex = append(ex, fmt.Sprint(p))
	}
	var n int
	if err := raw.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
		AND backend_type = 'client backend' AND application_name NOT IN ('` + rawApp + `', 'lockhooks_debug_blocker')
		AND pid NOT IN (` + strings.Join(ex, ",") + `)`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Sixty concurrent loads of the page while forty server waits log that
// they are slow, on a database whose pool has room for its waiters and two
// more connections: the database's backends other than the waiters' never
// exceed those two plus sideConnsPerDatabase, every page answers 200 and
// names the outside holder for every waiter, and after db.Close no backend
// of the database remains.
func TestSideConnectionsBounded(t *testing.T) {
	const waiters, loads, spare = 40, 60, 2
	dsn := pgtest.DSN(t)
	buf := &syncBuffer{}
	db := openDSN(t, dsn, slowLogOptions(buf, 20*time.Millisecond)...)
	db.SetMaxOpenConns(waiters + spare)
	raw := openRawApp(t, dsn)
	raw.SetMaxOpenConns(2) // the outside holder, and the sampling below
	const key = 7302
	hc, holder := rawBlockerOf(t, raw, queueLock, key, "side")
	ctx := context.Background()

	done := make(chan error, waiters)
	for range waiters {
		go func() {
			done <- lockOnOwnConn(ctx, db, key)
		}()
	}

	// The sampler: the database's backends other than raw's (the outside
	// holder's and its own). The pool has at most waiters+spare
	// connections, so every backend beyond that is a side connection.
	var most atomic.Int64
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			var n int64
			err := raw.QueryRow(`SELECT count(*) FROM pg_stat_activity a WHERE a.datname = current_database()
				AND a.backend_type = 'client backend' AND a.application_name NOT IN ($1, 'lockhooks_debug_blocker')`, rawApp).Scan(&n)
			if err == nil && n > most.Load() {
				most.Store(n)
			}
			select {
			case <-stopSampling:
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	}()

	srv := httptest.NewServer(DebugHandler(db))
	defer srv.Close()
	logged := func() bool { return strings.Count(buf.String(), "slow lock wait: still waiting") >= waiters }
	allLogged := make(chan struct{})
	go func() {
		defer close(allLogged)
		for stop := time.Now().Add(time.Minute); !logged() && time.Now().Before(stop); {
			time.Sleep(5 * time.Millisecond)
		}
	}()
	var wg sync.WaitGroup
	var named atomic.Int64
	errs := make(chan error, loads)
	deadline := time.Now().Add(60 * time.Second)
	for range loads {
		wg.Go(func() {
			lastBad := ""
			for {
				rep, err := loadDebugJSON(srv.URL + "?format=json")
				if err != nil {
					errs <- err
					return
				}
				if len(rep.Databases) == 1 && len(rep.Databases[0].Waiters) == waiters {
					all := true
					for _, w := range rep.Databases[0].Waiters {
						if ok := len(w.Blockers) > 0 && w.Blockers[0].PID == holder && !w.Blockers[0].Waiting; !ok {
							all, lastBad = false, fmt.Sprintf("%+v; notes %v", w, rep.Databases[0].Notes)
							break
						}
					}
					if all {
						named.Add(1)
						return // the page named the holder of every wait
					}
				}
				time.Sleep(20 * time.Millisecond) // pacing: a load every 20ms per client, not a busy loop
				if time.Now().After(deadline) {
					errs <- fmt.Errorf("no page named the holder %d of all %d waiters within the deadline (%d logged); %d waiters, the last one not named: %s",
						holder, waiters, strings.Count(buf.String(), "slow lock wait: still waiting"), len(rep.Databases[0].Waiters), lastBad)
					return
				}
			}
		})
	}
	wg.Wait()
	<-allLogged // the slow-wait log looks the waits up one after another
	close(stopSampling)
	<-sampled
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := named.Load(); got != loads {
		t.Errorf("%d of %d page loads named every holder", got, loads)
	}
	if got, limit := most.Load(), int64(waiters+spare+sideConnsPerDatabase); got > limit {
		t.Errorf("up to %d backends of the database besides the outside holder, want at most %d (a pool of %d waiters and %d spare, and %d side connections)",
			got, limit, waiters, spare, sideConnsPerDatabase)
	}
	t.Logf("at most %d backends of the database besides the outside holder (%d waiters)", most.Load(), waiters)
	if !logged() {
		t.Errorf("%d of %d waits logged that they are slow", strings.Count(buf.String(), "slow lock wait: still waiting"), waiters)
	}
	if !strings.Contains(buf.String(), fmt.Sprintf("holder_pid=%d", holder)) {
		t.Errorf("the slow-wait lines do not name the holder pid %d:\n%s", holder, buf.String())
	}

	hc.ExecContext(ctx, "SELECT "+queueUnlock, key)
	hc.Close()
	for range waiters {
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("waiter: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the waiters did not get the key after the unlock")
		}
	}
	db.Close()
	noBackendLeft(t, raw)
	noAdvisoryLocksLeftRaw(t, raw)
}

// noBackendLeft waits until raw's database has no client backend but
// raw's own (db.Close ended every other), naming those left if some stay.
func noBackendLeft(t testing.TB, raw *sql.DB) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for lockhooksBackends(t, raw) != 0 {
		if time.Now().After(deadline) {
			rows, err := raw.Query(`SELECT pid, application_name, state, query FROM pg_stat_activity
				WHERE datname = current_database() AND backend_type = 'client backend' AND application_name NOT IN ($1, 'lockhooks_debug_blocker')`, rawApp)
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			for rows.Next() {
				var pid int
				var app, state, query string
				rows.Scan(&pid, &app, &state, &query)
				t.Errorf("left after db.Close: backend %d (%q, %s): %.200s", pid, app, state, query)
			}
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// noAdvisoryLocksLeftRaw fails t if any advisory lock is held.
func noAdvisoryLocksLeftRaw(t testing.TB, raw *sql.DB) {
	t.Helper()
	var n int
	if err := raw.QueryRow("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d advisory locks left", n)
	}
}

// loadDebugJSON fetches the page's JSON, for goroutines other than the
// test's.
func loadDebugJSON(url string) (debugpage.Report, error) {
	var rep debugpage.Report
	resp, err := http.Get(url)
	if err != nil {
		return rep, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return rep, err
	}
	if resp.StatusCode != http.StatusOK {
		return rep, fmt.Errorf("GET %s: %s\n%s", url, resp.Status, body)
	}
	return rep, json.Unmarshal(body, &rep)
}

// The side connection is used by one lookup at a time: a lookup whose
// context ends while another uses it stops waiting; a read whose context
// ends mid-statement leaves no broken connection behind (the next lookup
// opens a fresh one and succeeds); the database never has more than one
// such backend; and db.Close closes it.
func TestSideConnectionTurnsAndCancel(t *testing.T) {
	dsn := pgtest.DSN(t)
	db := openDSN(t, dsn)
	raw := openRawApp(t, dsn)
	raw.SetMaxOpenConns(1)
	db.SetMaxOpenConns(1)
	c := connectorOf(t, db)
	ctx := context.Background()
	one := func(conn driver.Conn) error {
		rows, err := rawconn.Query(ctx, conn, "SELECT 1", nil)
		if err != nil {
			return err
		}
		return rows.Close()
	}

	// One lookup holds the turn; another's context ends while it waits.
	inUse, release := make(chan struct{}), make(chan struct{})
	held := make(chan error, 1)
	go func() {
		held <- c.side.Use(ctx, func(conn driver.Conn) error {
			close(inUse)
			<-release
			return one(conn)
		})
	}()
	<-inUse
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	start := time.Now()
	err := c.side.Use(short, one)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 5*time.Second {
		t.Fatalf("a lookup waiting for the side connection in use: %v after %v, want the context's deadline", err, time.Since(start))
	}
	close(release)
	if err := <-held; err != nil {
		t.Fatal(err)
	}

	// A read cancelled mid-statement: the next one works.
	sleepCtx, cancelSleep := context.WithCancel(ctx)
	go func() {
		waitFor(t, 10*time.Second, "the side connection's pg_sleep", func() bool {
			var n int
			raw.QueryRow("SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(30)' AND state = 'active'").Scan(&n)
			return n == 1
		})
		cancelSleep()
	}()
	err = c.side.Use(sleepCtx, func(conn driver.Conn) error {
		rows, err := rawconn.Query(sleepCtx, conn, "SELECT pg_sleep(30)", nil)
		if err == nil {
			dest := make([]driver.Value, 1)
			err = rows.Next(dest)
			rows.Close()
		}
		return err
	})
	if err == nil {
		t.Fatal("the cancelled read succeeded")
	}
	for range 3 {
		if err := c.side.Use(ctx, one); err != nil {
			t.Fatalf("a lookup after a cancelled read: %v", err)
		}
	}
	// The cancelled read's backend exits a moment after its connection
	// closed; then the database has its pool and one side connection.
	pool := db.Stats().OpenConnections
	waitFor(t, 10*time.Second, fmt.Sprintf("at most %d pool connection(s) and one side connection", pool), func() bool {
		return lockhooksBackends(t, raw) <= pool+1
	})
	db.Close()
	noBackendLeft(t, raw)
	if err := c.side.Use(ctx, one); !errors.Is(err, rawconn.ErrSideClosed) {
		t.Errorf("a lookup after db.Close: %v, want rawconn.ErrSideClosed", err)
	}
}
