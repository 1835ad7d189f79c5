package lockhooks

// Network faults between the driver and the server, injected by the TCP proxy:
// a partition, half-open sockets of holders and waiters, a silent network at
// Close, and the end requests and side connections of the monitor.

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
	"github.com/lockhooks/lockhooks/internal/faultproxy"
	"github.com/lockhooks/lockhooks/internal/pgsession"
	"github.com/lockhooks/lockhooks/internal/pgtest"
)

// Point 3: the server cannot be reached (a partition: the proxy refuses
// new connections and black-holes the open ones): Lost fires, as no
// reachable server means the lock cannot be assumed held. Once the server
// can be reached again, the lost holder's backend, which kept the lock all
// along, is ended, so the key is free.
func TestUnreachableServerLosesTheLock(t *testing.T) {
	e := newFaultEnv(t, nil, withCheckTimeout(500*time.Millisecond))
	ctx := context.Background()
	l, err := AcquireAdvisoryLock(ctx, e.wrapped, 92)
	if err != nil {
		t.Fatal(err)
	}
	pid := l.c.pin.PID.Load()
	e.proxy.Refuse()
	e.proxy.BlackHoleAll()
	lostWithin(t, l, 20*time.Second)
	if !errors.Is(l.Err(), ErrLockLost) || !strings.Contains(l.Err().Error(), "could not be reached") {
		t.Fatalf("Err() = %v", l.Err())
	}
	if !grantedTo(t, e.raw, pid, 92) {
		t.Fatal("the partitioned holder's backend no longer holds the lock; the test needs it to")
	}
	if err := e.proxy.Listen(); err != nil { // new connections work again; the holder's stays black-holed
		t.Fatal(err)
	}
	e.waitGone(t, pid)
	if n := heldCount(t, e.raw, 92); n != 0 {
		t.Fatalf("%d holders of 92 after the lost holder was ended", n)
	}
	if err := l.Release(ctx); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Release: %v, want ErrLockLost", err)
	}
}

// Point 8: the holder's socket is half-open (the client's side is broken,
// the server keeps its socket and the backend its lock, until TCP
// keepalive). lockhooks finds the connection broken at its next statement,
// reports the lock lost, and ends the backend, so the key is truly free;
// this process's next acquirer takes it.
func TestHalfOpenHolderIsEnded(t *testing.T) {
	e := newFaultEnv(t, nil)
	ctx := context.Background()
	l, err := AcquireAdvisoryLock(ctx, e.wrapped, 95)
	if err != nil {
		t.Fatal(err)
	}
	pid := l.c.pin.PID.Load()
	e.linkOf(t, pid).CutClient()
	if _, err := l.Conn().ExecContext(ctx, "SELECT 1"); !errors.Is(err, ErrLockLost) {
		t.Fatalf("a statement on the half-open holder: %v, want ErrLockLost", err)
	}
	lostWithin(t, l, time.Second)
	e.waitGone(t, pid)
	l2, ok, err := TryAdvisoryLock(ctx, e.wrapped, 95)
	if err != nil || !ok {
		t.Fatalf("the next acquirer: %v, %v; want the key", ok, err)
	}
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(e.log.String(), "ended the backend of a lost advisory lock holder") {
		t.Errorf("no log line for the ended backend:\n%s", e.log)
	}
	l.Release(ctx)

	// A parked holder gone half-open: the rerouted unlock finds it broken,
	// and its backend is ended too.
	c := otherConn(t, e.wrapped)
	mustExec(t, c, "SELECT pg_advisory_lock(96)")
	pid = trackedConn(t, c).pin.PID.Load()
	c.Close() // parked
	e.linkOf(t, pid).CutClient()
	if _, err := unlock(t, e.wrapped, 96); !errors.Is(err, ErrLockLost) {
		t.Fatalf("the unlock rerouted to the half-open parked holder: %v, want ErrLockLost", err)
	}
	e.waitGone(t, pid)
}

// Point 9: db.Close with a silent network (every link and every new
// connection black-holed) returns promptly, although a check in flight
// would wait its whole timeout (a minute here): Close cuts it.
func TestCloseWithASilentNetworkIsPrompt(t *testing.T) {
	e := newFaultEnv(t, nil, withCheckTimeout(time.Minute))
	ctx := context.Background()
	l, err := AcquireAdvisoryLock(ctx, e.wrapped, 97)
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, e.wrapped, "SELECT pg_advisory_lock(98)") // a parked holder too
	e.proxy.SetMode(faultproxy.BlackHole)
	e.proxy.BlackHoleAll()
	// The monitor checks every 20 ms: within this it is inside a check that
	// cannot complete (the test holds either way; this makes it exercise
	// the cut).
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	closed := make(chan error, 1)
	go func() { closed <- e.wrapped.Close() }()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("db.Close did not return within 30s with a silent network")
	}
	t.Logf("db.Close returned after %v", time.Since(start))
	if err := l.Release(ctx); err == nil {
		t.Fatal("Release after db.Close succeeded")
	}
	e.proxy.Close() // the server's sockets close: the backends exit
}

// Measured after the list: a lost lock frees its in-process turn. After
// Lost(), another acquirer of this process takes the key at once, without
// waiting for the lost lock's Release.
func TestLostLockFreesItsTurn(t *testing.T) {
	e := newPinEnv(t)
	ctx := context.Background()
	l, err := AcquireAdvisoryLock(ctx, e.wrapped, 100)
	if err != nil {
		t.Fatal(err)
	}
	pid := l.c.pin.PID.Load()
	terminate(t, e.raw, pid)
	waitFor(t, 20*time.Second, "the holder's backend to exit", func() bool { return !backendAlive(t, e.raw, pid) })
	lostWithin(t, l, 20*time.Second)
	l2, ok, err := TryAdvisoryLock(ctx, e.wrapped, 100)
	if err != nil || !ok {
		t.Fatalf("TryAdvisoryLock after Lost(): %v, %v; want the key", ok, err)
	}
	// A blocking acquirer too, while l2 holds it: it waits for l2, not l.
	done := make(chan error, 1)
	go func() {
		l3, err := AcquireAdvisoryLock(ctx, e.wrapped, 100)
		if err == nil {
			err = l3.Release(ctx)
		}
		done <- err
	}()
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the blocking acquirer still waits after the live holder released")
	}
	if err := l.Release(ctx); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Release of the lost lock: %v, want ErrLockLost", err)
	}
}

// Point 12: Lock of more ids than a Postgres target list may hold (1664)
// works, as on SQLite: all of them are held by the transaction, in one
// statement; TryLock of as many is all or none.
func TestLockOfManyIDs(t *testing.T) {
	e := newPinEnv(t)
	ctx := context.Background()
	ids := make([]any, 2000)
	for i := range ids {
		ids[i] = i
	}
	tx, err := e.wrapped.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := Lock(ctx, tx, "many", ids...); err != nil {
		t.Fatalf("Lock of %d ids: %v", len(ids), err)
	}
	var held int
	if err := tx.QueryRowContext(ctx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND pid = pg_backend_pid()").Scan(&held); err != nil || held != len(ids) {
		t.Fatalf("%d advisory locks held (%v), want %d", held, err, len(ids))
	}
	other, err := e.wrapped.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback()
	if ok, err := TryLock(ctx, other, "many", ids...); err != nil || ok {
		t.Fatalf("TryLock of ids another transaction holds: %v, %v", ok, err)
	}
	var mine int
	if err := other.QueryRowContext(ctx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()").Scan(&mine); err != nil || mine != 0 {
		t.Fatalf("a failed TryLock left %d keys held (%v)", mine, err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if ok, err := TryLock(ctx, other, "many", ids...); err != nil || !ok {
		t.Fatalf("TryLock of %d free ids: %v, %v", len(ids), ok, err)
	}
	if err := other.Commit(); err != nil {
		t.Fatal(err)
	}
	if n := func() int {
		var n int
		e.raw.QueryRow("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").Scan(&n)
		return n
	}(); n != 0 {
		t.Fatalf("%d advisory locks left after both transactions ended", n)
	}
}

// Point 4 and 8 together: the connection of a waiting AcquireAdvisoryLock
// goes half-open (its client's side reset, the server's backend still
// waiting for the lock), and the network swallows new connections for a
// moment, so the driver's cancel request never arrives either. The acquire
// fails; the backend would be granted the lock when the holder lets go,
// with nobody left to unlock it: lockhooks ends it, and this process's next
// acquirer takes the key.
func TestHalfOpenWaiterIsEnded(t *testing.T) {
	e := newFaultEnv(t, nil, withCheckTimeout(500*time.Millisecond))
	ctx := context.Background()
	blocker := otherConn(t, e.raw)
	mustExec(t, blocker, "SELECT pg_advisory_lock(104)")
	done := make(chan error, 1)
	go func() {
		l, err := AcquireAdvisoryLock(ctx, e.wrapped, 104)
		if err == nil {
			l.Release(ctx)
			err = errors.New("acquired")
		}
		done <- err
	}()
	pid := waiterOn(t, e.raw, e.app, 104)
	// The network refuses new connections for a moment: the cancel request
	// pgx sends when it gives up on a connection never arrives.
	before := e.proxy.Accepted()
	e.proxy.SetMode(faultproxy.Reject)
	e.linkOf(t, pid).CutClient()
	if err := <-done; err == nil || err.Error() == "acquired" {
		t.Fatalf("AcquireAdvisoryLock on a half-open connection: %v, want an error", err)
	}
	// pgx's cancel request (sent at once) and the monitor's first two tries
	// were refused.
	waitFor(t, 20*time.Second, "the cancel request to be refused", func() bool {
		return e.proxy.Accepted() >= before+3 && strings.Count(e.log.String(), "checking advisory-lock holders failed") >= 2
	})
	e.proxy.SetMode(faultproxy.Forward)
	defer func() {
		if t.Failed() {
			var state, query string
			e.raw.QueryRow("SELECT coalesce(state,''), coalesce(query,'') FROM pg_stat_activity WHERE pid = $1", pid).Scan(&state, &query)
			t.Logf("backend %d: state %q, query %q; log:\n%s", pid, state, query, e.log)
		}
	}()
	e.waitGone(t, pid)
	mustExec(t, blocker, "SELECT pg_advisory_unlock(104)")
	l, ok, err := TryAdvisoryLock(ctx, e.wrapped, 104)
	if err != nil || !ok {
		t.Fatalf("the next acquirer: %v, %v; want the key", ok, err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// Review 2, finding 1: a request to end a lost holder's backend names one
// backend, not a pid. The backend of a client (not lockhooks') holds a key;
// a request for its pid ends it only if it is the same incarnation (its
// backend_start, on the same server: not a reused pid, nor another
// server's after a failover) and it ran nothing since the request's quiet
// time (not a backend a pooler gave to another client since).
func TestEndRequestEndsOnlyTheBackendItNames(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.DSN(t)
	raw, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	side, err := stdlib.GetDefaultDriver().Open(dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer side.Close()
	other := otherConn(t, raw)
	mustExec(t, other, "SELECT pg_advisory_lock(107)")
	pid := pidOf(t, other)
	var incarnation string
	if err := other.QueryRowContext(ctx, "SELECT "+pgsession.IncarnationExpr).Scan(&incarnation); err != nil {
		t.Fatal(err)
	}
	if pgsession.ReadIncarnation(incarnation) != incarnation {
		t.Fatalf("incarnation %q does not read as one", incarnation)
	}
	start, server, _ := strings.Cut(incarnation, "@")
	keys := []advisorykey.Key{{K1: 107}}
	for _, c := range []struct {
		what   string
		target pgsession.EndTarget
	}{
		{"another backend_start (a reused pid)", pgsession.EndTarget{PID: pid, Incarnation: "1" + start + "@" + server, Quiet: time.Now()}},
		{"another server (a failover)", pgsession.EndTarget{PID: pid, Incarnation: start + "@1" + server, Quiet: time.Now()}},
		{"a statement after the quiet time (another client of a pooler)", pgsession.EndTarget{PID: pid, Incarnation: incarnation, Quiet: time.Now().Add(-time.Minute)}},
		// A statement sent and never answered, within pgsession.EndSlack of which the
		// backend started another text: a client a session pooler gave the
		// backend to, not lockhooks' statement.
		{"another text within the slack of an unanswered statement", pgsession.EndTarget{PID: pid, Incarnation: incarnation, Quiet: time.Now().Add(-time.Minute),
			InFlight: true, SentQuiet: time.Now().Add(pgsession.EndSlack), Sent: "SELECT 1"}},
		{"an unanswered statement whose text is not known", pgsession.EndTarget{PID: pid, Incarnation: incarnation, Quiet: time.Now().Add(-time.Minute),
			InFlight: true, SentQuiet: time.Now().Add(pgsession.EndSlack)}},
		{"the very text, but started after the slack", pgsession.EndTarget{PID: pid, Incarnation: incarnation, Quiet: time.Now().Add(-time.Minute),
			InFlight: true, SentQuiet: time.Now().Add(-30 * time.Second), Sent: "SELECT " + pgsession.IncarnationExpr}},
	} {
		alive, ended, err := pgsession.EndBackend(ctx, pgsession.SideQueryRow(side), &pgsession.EndRequest{Target: c.target, Keys: keys})
		if err != nil || alive || ended {
			t.Errorf("%s: endBackend = %v, %v, %v; want neither there nor ended", c.what, alive, ended, err)
		}
	}
	if !backendAlive(t, raw, pid) {
		t.Fatal("a backend endBackend did not name was ended")
	}
	// The very backend, still showing the text of the unanswered statement
	// (its last, the incarnation read above, started within the slack):
	// ended.
	alive, ended, err := pgsession.EndBackend(ctx, pgsession.SideQueryRow(side), &pgsession.EndRequest{Target: pgsession.EndTarget{PID: pid, Incarnation: incarnation, Quiet: time.Now().Add(-time.Minute),
		InFlight: true, SentQuiet: time.Now().Add(pgsession.EndSlack), Sent: "SELECT " + pgsession.IncarnationExpr}, Keys: keys})
	if err != nil || !alive || !ended {
		t.Fatalf("the named backend, running the unanswered statement: endBackend = %v, %v, %v; want it ended", alive, ended, err)
	}
	waitFor(t, 10*time.Second, "the ended backend to exit", func() bool { return !backendAlive(t, raw, pid) })

	// Another backend, quiet since its last statement: ended.
	other = otherConn(t, raw)
	mustExec(t, other, "SELECT pg_advisory_lock(107)")
	pid = pidOf(t, other)
	if err := other.QueryRowContext(ctx, "SELECT "+pgsession.IncarnationExpr).Scan(&incarnation); err != nil {
		t.Fatal(err)
	}
	alive, ended, err = pgsession.EndBackend(ctx, pgsession.SideQueryRow(side), &pgsession.EndRequest{Target: pgsession.EndTarget{PID: pid, Incarnation: incarnation, Quiet: time.Now()}, Keys: keys})
	if err != nil || !alive || !ended {
		t.Fatalf("the named backend, quiet since its last statement: endBackend = %v, %v, %v; want it ended", alive, ended, err)
	}
	waitFor(t, 10*time.Second, "the ended backend to exit", func() bool { return !backendAlive(t, raw, pid) })
}

// Point 3's counterpart: a side connection the monitor kept from an earlier
// check is ended between checks (here by pg_terminate_backend, as
// idle_session_timeout or a pooler's lifetime would): the next check opens
// a fresh one, and the holder, alive all along, is not reported lost.
func TestMonitorReplacesItsEndedSideConnection(t *testing.T) {
	e := newFaultEnv(t, nil, WithLockCheckInterval(50*time.Millisecond))
	ctx := context.Background()
	l, err := AcquireAdvisoryLock(ctx, e.wrapped, 105)
	if err != nil {
		t.Fatal(err)
	}
	holder := l.c.pin.PID.Load()
	sideOf := func() int32 {
		var pid int32
		err := e.raw.QueryRow(`SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND pid <> $2 ORDER BY backend_start DESC LIMIT 1`, e.app, holder).Scan(&pid)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			t.Fatal(err)
		}
		return pid
	}
	var last int32
	for range 3 {
		var side int32
		waitFor(t, 20*time.Second, "the monitor's side connection", func() bool { side = sideOf(); return side != 0 && side != last })
		terminate(t, e.raw, side)
		last = side
	}
	waitFor(t, 20*time.Second, "a fresh side connection", func() bool { s := sideOf(); return s != 0 && s != last })
	select {
	case <-l.Lost():
		t.Fatalf("the holder was reported lost: %v", l.Err())
	default:
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// The session marker is lockhooks' own statement at connect; a server that
// refuses it (here a set_config of the database's own, first on the
// search_path, that raises) still gets its connections opened, by the pid
// alone, and the pooler guard does without markers.
func TestConnectWithoutSessionMarker(t *testing.T) {
	e := newFaultEnv(t, nil)
	mustExec(t, e.raw, "CREATE SCHEMA shadow")
	mustExec(t, e.raw, `CREATE FUNCTION shadow.set_config(text, text, boolean) RETURNS text LANGUAGE plpgsql AS $$BEGIN RAISE EXCEPTION 'no custom settings here'; END$$`)
	mustExec(t, e.raw, "ALTER DATABASE "+e.db+" SET search_path = shadow, pg_catalog, public")
	c := otherConn(t, e.wrapped)
	w := trackedConn(t, c)
	if pid := pidOf(t, c); w.pin.PID.Load() != pid || w.mark != "" {
		t.Fatalf("connection opened with pid %d (want %d), marker %q (want none)", w.pin.PID.Load(), pid, w.mark)
	}
	mustExec(t, c, "SELECT pg_advisory_lock(108)")
	assertTracked(t, e.raw, w)
	if ok, err := unlock(t, c, 108); !ok || err != nil {
		t.Fatalf("unlock: %v, %v", ok, err)
	}
}
