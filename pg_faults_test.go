package lockhooks

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/lockhooks/lockhooks/internal/faultproxy"
	"github.com/lockhooks/lockhooks/internal/pgtest"
)

// Faults injected for real (issue 21): a TCP proxy between the driver and
// the server that cuts, half-opens and black-holes connections;
// pg_terminate_backend; server timeouts set per database; stopped
// processes. Each test states the promise it holds.

// faultEnv is a pinEnv whose lockhooks database reaches the server through
// a fault-injecting proxy; raw goes straight to the server and opts out of
// the timeouts the test sets on the database.
type faultEnv struct {
	*pinEnv
	proxy *faultproxy.Proxy
	db    string // the database's name
	dsn   string // straight to the server
}

// timeoutSettings are the server timeouts a test may set on its database;
// raw connections turn them off for themselves.
var timeoutSettings = []string{"idle_session_timeout", "idle_in_transaction_session_timeout", "lock_timeout", "statement_timeout"}

// newFaultEnv creates a fresh database, sets settings on it (ALTER
// DATABASE … SET, so every new session of lockhooks gets them) and opens
// it through lockhooks behind a proxy, and raw directly.
func newFaultEnv(t *testing.T, settings map[string]string, opts ...Option) *faultEnv {
	t.Helper()
	dsn := pgtest.DSN(t)
	proxiedDSN, proxy := throughFaultProxy(t, dsn)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	e := &faultEnv{proxy: proxy, db: strings.TrimPrefix(u.Path, "/"), dsn: dsn,
		pinEnv: &pinEnv{log: &syncBuffer{}, metrics: sdkmetric.NewManualReader(), app: fmt.Sprintf("lockhooks_test_%d", appSeq.Add(1))}}
	q := u.Query()
	for _, s := range timeoutSettings {
		q.Set(s, "0") // a runtime parameter: raw's sessions are exempt
	}
	rawURL := *u
	rawURL.RawQuery = q.Encode()
	if e.raw, err = sql.Open("pgx", rawURL.String()); err != nil {
		t.Fatal(err)
	}
	for name, value := range settings {
		mustExec(t, e.raw, fmt.Sprintf("ALTER DATABASE %s SET %s = '%s'", e.db, name, value))
	}
	opts = append([]Option{
		WithLockCheckInterval(20 * time.Millisecond),
		WithLogger(slog.New(slog.NewTextHandler(e.log, nil))),
		WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(e.metrics))),
	}, opts...)
	if e.wrapped, err = Open("pgx", withApp(proxiedDSN, e.app), opts...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		e.wrapped.Close()
		proxy.Close() // a half-open link's server side is closed here at the latest
		assertNothingLeft(t, e.raw, e.app)
		e.raw.Close()
	})
	return e
}

// withCheckTimeout bounds lockhooks' own checks (the monitor's, reads of
// pg_locks, rerouted unlocks); a test option.
func withCheckTimeout(d time.Duration) Option {
	return func(o *options) { o.lockCheckTimeout = d }
}

// linkOf returns the proxy's link of backend pid.
func (e *faultEnv) linkOf(t testing.TB, pid int32) *faultproxy.Link {
	t.Helper()
	var port int
	if err := e.raw.QueryRow("SELECT client_port FROM pg_stat_activity WHERE pid = $1", pid).Scan(&port); err != nil {
		t.Fatalf("client port of backend %d: %v", pid, err)
	}
	l := e.proxy.LinkByServerPort(port)
	if l == nil {
		t.Fatalf("no proxy link for backend %d (client port %d)", pid, port)
	}
	return l
}

// waitGone waits until backend pid has exited.
func (e *faultEnv) waitGone(t testing.TB, pid int32) {
	t.Helper()
	waitFor(t, 20*time.Second, fmt.Sprintf("backend %d to exit", pid), func() bool { return !backendAlive(t, e.raw, pid) })
}

// lostWithin waits for l.Lost() and fails after limit.
func lostWithin(t testing.TB, l *AdvisoryLock, limit time.Duration) {
	t.Helper()
	select {
	case <-l.Lost():
	case <-time.After(limit):
		t.Fatalf("Lost() did not close within %v", limit)
	}
}

// Point 7: the server ends an idle session holding a session lock
// (idle_session_timeout, FATAL 57P05): the next statement on it fails with
// ErrLockLost, found by the statement itself (the monitor is off).
func TestIdleSessionTimeoutIsALostLock(t *testing.T) {
	e := newFaultEnv(t, map[string]string{"idle_session_timeout": "300ms"}, WithLockCheckInterval(time.Hour))
	ctx := context.Background()
	c := otherConn(t, e.wrapped)
	mustExec(t, c, "SELECT pg_advisory_lock(71)")
	pid := trackedConn(t, c).pid.Load()
	e.waitGone(t, pid)
	_, err := c.ExecContext(ctx, "SELECT 1")
	if !errors.Is(err, ErrLockLost) {
		t.Fatalf("statement after idle_session_timeout ended the holder: %v, want ErrLockLost", err)
	}
	t.Log(err)
	if _, err := c.ExecContext(ctx, "SELECT 1"); !errors.Is(err, ErrLockLost) {
		t.Fatalf("the statement after: %v, want ErrLockLost again", err)
	}
}

// Point 7: the server ends a transaction left idle on a connection holding
// a session lock (idle_in_transaction_session_timeout, FATAL 25P03): the
// transaction's next statement fails with ErrLockLost.
func TestIdleInTransactionTimeoutIsALostLock(t *testing.T) {
	e := newFaultEnv(t, map[string]string{"idle_in_transaction_session_timeout": "300ms"}, WithLockCheckInterval(time.Hour))
	ctx := context.Background()
	c := otherConn(t, e.wrapped)
	mustExec(t, c, "SELECT pg_advisory_lock(72)")
	pid := trackedConn(t, c).pid.Load()
	tx, err := c.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	e.waitGone(t, pid)
	_, err = tx.ExecContext(ctx, "SELECT 1")
	if !errors.Is(err, ErrLockLost) {
		t.Fatalf("statement after idle_in_transaction_session_timeout ended the holder: %v, want ErrLockLost", err)
	}
	t.Log(err)
}

// Point 7: RunInTx retries a transaction the server ended for idling
// (25P03); the second attempt does not idle and commits.
func TestRunInTxRetriesIdleInTransactionTimeout(t *testing.T) {
	e := newFaultEnv(t, map[string]string{"idle_in_transaction_session_timeout": "300ms"})
	mustExec(t, e.raw, "CREATE TABLE jobs (id int)")
	ctx := context.Background()
	attempts := 0
	var retried []error
	err := RunInTx(ctx, e.wrapped, nil, func(tx *sql.Tx) error {
		attempts++
		var pid int32
		if err := tx.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			return err
		}
		if attempts == 1 {
			e.waitGone(t, pid) // the server ends the idle transaction
		}
		_, err := tx.ExecContext(ctx, "INSERT INTO jobs VALUES (1)")
		return err
	}, OnRetry(func(ev RetryEvent) { retried = append(retried, ev.Err) }))
	if err != nil {
		t.Fatalf("RunInTx: %v (retried %v)", err, retried)
	}
	if attempts != 2 || len(retried) != 1 || sqlState(retried[0]) != stateIdleInTx {
		t.Fatalf("%d attempts, retried %v; want 2 attempts, one retry of 25P03", attempts, retried)
	}
	var n int
	if err := e.raw.QueryRow("SELECT count(*) FROM jobs").Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d rows (%v), want 1", n, err)
	}
}

// Point 6: RunInTx retries only the database's errors. An HTTP call inside
// fn that fails with io.EOF (a *url.Error, which is a net.Error) is fn's
// own: one attempt, the external call made once. A connection the proxy
// cuts under the transaction is the database's: retried.
func TestRunInTxDoesNotRetryFnsOwnNetworkErrors(t *testing.T) {
	e := newFaultEnv(t, nil)
	ctx := context.Background()
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		c, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			c.Close() // no answer: the client reads EOF
		}
	}))
	defer srv.Close()
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"http", func() error {
			resp, err := srv.Client().Get(srv.URL)
			if err == nil {
				resp.Body.Close()
				return errors.New("the server answered")
			}
			return err
		}},
		{"bare io.EOF", func() error { hits.Add(1); return io.EOF }},
		{"wrapped net.ErrClosed", func() error { hits.Add(1); return fmt.Errorf("calling the billing service: %w", net.ErrClosed) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hits.Store(0)
			attempts := 0
			err := RunInTx(ctx, e.wrapped, nil, func(tx *sql.Tx) error {
				attempts++
				if _, err := tx.ExecContext(ctx, "SELECT 1"); err != nil {
					return err
				}
				return tc.call()
			})
			var re *RetryError
			if err == nil || !errors.As(err, &re) || re.Attempts != 1 || attempts != 1 || hits.Load() != 1 {
				t.Fatalf("RunInTx: %v after %d attempts, %d external calls; want fn's error after one", err, attempts, hits.Load())
			}
			if !connectionLost(re.Err) {
				t.Fatalf("the case does not look like a broken connection, so it tests nothing: %v", re.Err)
			}
		})
	}
	t.Run("the transaction's connection cut", func(t *testing.T) {
		attempts := 0
		var retried []error
		err := RunInTx(ctx, e.wrapped, nil, func(tx *sql.Tx) error {
			attempts++
			var pid int32
			if err := tx.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
				return err
			}
			if attempts == 1 {
				e.linkOf(t, pid).Cut()
			}
			_, err := tx.ExecContext(ctx, "SELECT 1")
			return err
		}, OnRetry(func(ev RetryEvent) { retried = append(retried, ev.Err) }))
		if err != nil || attempts != 2 || len(retried) != 1 {
			t.Fatalf("RunInTx: %v after %d attempts (retried %v); want success after a retry", err, attempts, retried)
		}
	})
}

// stopBackend stops backend pid (SIGSTOP) and returns the function that
// resumes it (SIGCONT); the test's cleanup resumes it at the latest. A
// stopped backend's timers still expire in wall-clock time: their signals
// wait, and are handled the moment it resumes.
func stopBackend(t testing.TB, pid int32) (resume func()) {
	t.Helper()
	if err := syscall.Kill(int(pid), syscall.SIGSTOP); err != nil {
		t.Fatalf("stopping backend %d: %v", pid, err)
	}
	var once sync.Once
	resume = func() { once.Do(func() { syscall.Kill(int(pid), syscall.SIGCONT) }) }
	t.Cleanup(resume)
	return resume
}

// waiterOn returns the backend of app waiting for advisory key k.
func waiterOn(t testing.TB, raw *sql.DB, app string, k int64) int32 {
	t.Helper()
	var pid int32
	waitFor(t, 20*time.Second, fmt.Sprintf("a backend of %s waiting for key %d", app, k), func() bool {
		err := raw.QueryRow(`SELECT l.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
			WHERE l.locktype = 'advisory' AND NOT l.granted AND l.objid = $1 AND a.application_name = $2`, k, app).Scan(&pid)
		return err == nil
	})
	return pid
}

// grantedTo reports whether backend pid holds advisory key k.
func grantedTo(t testing.TB, raw *sql.DB, pid int32, k int64) bool {
	t.Helper()
	var n int
	if err := raw.QueryRow(`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND pid = $1 AND objid = $2`, pid, k).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n > 0
}

// grantDuringTimeout makes a timeout fire as the waiting backend pid is
// granted key k: the backend is stopped, blocker unlocks k (the server
// grants it to the stopped backend), the timeout expires meanwhile, and
// the backend resumes to find both.
func grantDuringTimeout(t testing.TB, raw *sql.DB, blocker *sql.Conn, pid int32, k int64, timeout time.Duration) {
	t.Helper()
	resume := stopBackend(t, pid)
	mustExec(t, blocker, "SELECT pg_advisory_unlock($1)", k)
	waitFor(t, 20*time.Second, "the stopped waiter to be granted the lock", func() bool { return grantedTo(t, raw, pid, k) })
	time.Sleep(timeout + 200*time.Millisecond) // the stopped backend's timer expires (wall clock)
	resume()
}

// Point 1: lock_timeout (55P03) fires just as the lock is granted; Postgres
// keeps the lock. The tracking must say so: the connection is parked, not
// pooled, and the unlock through the pool answers true instead of
// ErrNotLockOwner.
func TestLockTimeoutRacingTheGrantIsTracked(t *testing.T) {
	const timeout = time.Second
	e := newFaultEnv(t, map[string]string{"lock_timeout": timeout.String()}, WithLockCheckInterval(time.Hour))
	ctx := context.Background()
	blocker := otherConn(t, e.raw)
	mustExec(t, blocker, "SELECT pg_advisory_lock(81)")
	c := otherConn(t, e.wrapped)
	done := make(chan error, 1)
	go func() {
		_, err := c.ExecContext(ctx, "SELECT pg_advisory_lock(81)")
		done <- err
	}()
	pid := waiterOn(t, e.raw, e.app, 81)
	grantDuringTimeout(t, e.raw, blocker, pid, 81, timeout)
	err := <-done
	if !IsLockNotAvailable(err) {
		t.Fatalf("the lock statement: %v, want lock_not_available (55P03)", err)
	}
	if !grantedTo(t, e.raw, pid, 81) {
		t.Fatal("the race was not reproduced: the backend does not hold the lock")
	}
	w := trackedConn(t, c)
	assertTracked(t, e.raw, w)
	c.Close() // parks: it holds 81
	if ok, err := unlock(t, e.wrapped, 81); !ok || err != nil {
		t.Fatalf("unlock of the lock the timeout left behind: %v, %v", ok, err)
	}
	if n := heldCount(t, e.raw, 81); n != 0 {
		t.Fatalf("%d holders of 81 after the unlock", n)
	}
}

// Point 4: AcquireAdvisoryLock fails (statement_timeout, 57014, fired just
// as the lock was granted) and leaves nothing behind: the key is free on
// the server, and the process's next acquirer takes it at once.
func TestFailedAcquireLeavesNoLockBehind(t *testing.T) {
	const timeout = time.Second
	e := newFaultEnv(t, map[string]string{"statement_timeout": timeout.String()}, WithLockCheckInterval(time.Hour))
	ctx := context.Background()
	blocker := otherConn(t, e.raw)
	mustExec(t, blocker, "SELECT pg_advisory_lock(82)")
	done := make(chan error, 1)
	go func() {
		l, err := AcquireAdvisoryLock(ctx, e.wrapped, 82)
		if err == nil {
			l.Release(ctx)
			err = errors.New("acquired")
		}
		done <- err
	}()
	pid := waiterOn(t, e.raw, e.app, 82)
	grantDuringTimeout(t, e.raw, blocker, pid, 82, timeout)
	err := <-done
	if sqlState(err) != "57014" {
		t.Fatalf("AcquireAdvisoryLock: %v, want the statement timeout (57014)", err)
	}
	t.Log(err)
	if n := heldCount(t, e.raw, 82); n != 0 {
		t.Fatalf("the failed acquire left key 82 held (%d holders)", n)
	}
	l, ok, err := TryAdvisoryLock(ctx, e.wrapped, 82)
	if err != nil || !ok {
		t.Fatalf("the next acquirer of the process: %v, %v; want the key", ok, err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// newOwnPoolerEnv is newPoolerEnv through a PgBouncer of the test's own,
// started after the database was created, so that it stops before the
// database is dropped. Tests that end server connections need one:
// PgBouncer 1.18 crashes ("server in bad state") when a server connection
// it is sending a cancel request for (pgx sends one whenever it gives up on
// a connection) is ended under it, by pg_terminate_backend or by the
// drop, and the shared PgBouncer must outlive every test of the binary.
func newOwnPoolerEnv(t *testing.T, opts pgtest.PoolerOptions) (*poolerEnv, *pgtest.Pooler) {
	t.Helper()
	dsn := pgtest.DSN(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	p := pgtest.StartPooler(t, opts)
	e := &poolerEnv{direct: dsn, pooled: p.DSNFor(strings.TrimPrefix(u.Path, "/")), log: &syncBuffer{},
		app: fmt.Sprintf("lockhooks_test_%d", appSeq.Add(1))}
	if e.raw, err = sql.Open("pgx", dsn); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.raw.Close() })
	return e, p
}

// newPoolerFaultEnv is newOwnPoolerEnv whose pooled DSN reaches PgBouncer
// through a fault-injecting proxy.
func newPoolerFaultEnv(t *testing.T) (*poolerEnv, *faultproxy.Proxy) {
	t.Helper()
	e, _ := newOwnPoolerEnv(t, pgtest.PoolerOptions{})
	var proxy *faultproxy.Proxy
	e.pooled, proxy = throughFaultProxy(t, e.pooled)
	return e, proxy
}

// throughFaultProxy starts a fault-injecting proxy in front of dsn's host,
// closed when t ends (if not before), and returns dsn through it.
func throughFaultProxy(t testing.TB, dsn string) (string, *faultproxy.Proxy) {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := faultproxy.Start(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	u.Host = proxy.Addr()
	return u.String(), proxy
}

// Point 4, through a transaction pooler: an acquire that fails after the
// holder took the lock. The case is TryAdvisoryLock's context
// ending while the holder runs the try-lock's third round trip (RELEASE
// SAVEPOINT): the holder has the lock, and database/sql then reports the
// context's error when its rows' context watcher wins the race with Scan,
// which no test can force. What that race reaches is the failed acquire's
// cleanup, driven here on a lock the holder really took: the key is
// unlocked on the server, the connection goes back, and the process's next
// acquirer takes the key.
func TestPoolerFailedAcquireLeavesNothing(t *testing.T) {
	e, _ := newOwnPoolerEnv(t, pgtest.PoolerOptions{})
	db := e.open(t, WithTransactionPooler())
	ctx := context.Background()
	l, ok, err := TryAdvisoryLock(ctx, db, 84)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	l.abandon() // as acquire does when lockOnServer failed
	l.c.connector.turns.unlock(l.key, l.turn)
	e.waitNoAdvisoryLocks(t)
	if s := db.Stats(); s.InUse != 0 {
		t.Errorf("%d connections still in use after the failed acquire", s.InUse)
	}
	l, ok, err = TryAdvisoryLock(ctx, db, 84)
	if err != nil || !ok {
		t.Fatalf("the next acquirer of the process: %v, %v; want the key", ok, err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// Point 2: through a transaction pooler, the holder keeping the lock is
// terminated; the protected work's next statement, and the COMMIT of a
// transaction begun before, fail with ErrLockLost before they run (the
// monitor is off: the statements find out themselves).
func TestPoolerLostHolderStopsTheNextStatement(t *testing.T) {
	e, _ := newOwnPoolerEnv(t, pgtest.PoolerOptions{})
	db := e.open(t, WithTransactionPooler(), WithLockCheckInterval(time.Hour))
	mustExec(t, e.raw, "CREATE TABLE work (n int)")
	ctx := context.Background()
	l, err := AcquireAdvisoryLock(ctx, db, 91)
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, l.Conn(), "INSERT INTO work VALUES (1)")
	tx, err := l.Conn().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO work VALUES (2)"); err != nil {
		t.Fatal(err)
	}
	holder := l.c.holderPID.Load()
	terminate(t, e.raw, holder)
	waitFor(t, 20*time.Second, "the holder's backend to exit", func() bool { return !backendAlive(t, e.raw, holder) })
	if err := tx.Commit(); !errors.Is(err, ErrLockLost) {
		t.Fatalf("COMMIT of the protected work after the holder died: %v, want ErrLockLost", err)
	}
	if _, err := l.Conn().ExecContext(ctx, "INSERT INTO work VALUES (3)"); !errors.Is(err, ErrLockLost) {
		t.Fatalf("a statement of the protected work after the holder died: %v, want ErrLockLost", err)
	}
	var n int
	if err := e.raw.QueryRow("SELECT count(*) FROM work WHERE n > 1").Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d rows written after the lock was lost (%v)", n, err)
	}
	lostWithin(t, l, time.Second)
	if err := l.Release(ctx); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Release: %v, want ErrLockLost", err)
	}
}

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
	pid := l.c.pid.Load()
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

// Point 3: PgBouncer crashes (SIGKILL): the holder's connection is gone,
// the server's backend with it, and another session can take the key.
// Lost fires, although the monitor cannot open its side connection.
func TestPoolerCrashLosesTheLock(t *testing.T) {
	e, p := newOwnPoolerEnv(t, pgtest.PoolerOptions{})
	db := e.open(t, WithTransactionPooler())
	ctx := context.Background()
	l, err := AcquireAdvisoryLock(ctx, db, 93)
	if err != nil {
		t.Fatal(err)
	}
	p.Crash(t)
	e.waitNoAdvisoryLocks(t)
	lostWithin(t, l, 20*time.Second)
	var got bool
	if err := e.raw.QueryRow("SELECT pg_try_advisory_lock(93)").Scan(&got); err != nil || !got {
		t.Fatalf("another session taking the key: %v, %v", got, err)
	}
	mustExec(t, e.raw, "SELECT pg_advisory_unlock_all()")
	if _, err := l.Conn().ExecContext(ctx, "SELECT 1"); !errors.Is(err, ErrLockLost) {
		t.Fatalf("a statement of the protected work: %v, want ErrLockLost", err)
	}
}

// Point 3: PgBouncer's admin KILL drops the database's client and server
// connections, and new clients wait until RESUME: the monitor's side
// connection cannot be opened within its check timeout. Lost fires.
func TestPoolerAdminKillLosesTheLock(t *testing.T) {
	e, p := newOwnPoolerEnv(t, pgtest.PoolerOptions{})
	db := e.open(t, WithTransactionPooler(), withCheckTimeout(500*time.Millisecond))
	ctx := context.Background()
	l, err := AcquireAdvisoryLock(ctx, db, 94)
	if err != nil {
		t.Fatal(err)
	}
	var name string
	if err := e.raw.QueryRow("SELECT current_database()").Scan(&name); err != nil {
		t.Fatal(err)
	}
	p.Admin(t, "KILL "+name)
	t.Cleanup(func() { p.Admin(t, "RESUME "+name) }) // runs before the cleanup of e.open (registered earlier)
	e.waitNoAdvisoryLocks(t)
	lostWithin(t, l, 20*time.Second)
	if !errors.Is(l.Err(), ErrLockLost) {
		t.Fatalf("Err() = %v", l.Err())
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
	pid := l.c.pid.Load()
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
	pid = trackedConn(t, c).pid.Load()
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

// Point 9 through a transaction pooler: db.Close with a silent network
// between lockhooks and PgBouncer returns promptly, without the holders'
// unlock-and-COMMIT round trips; once the connections go, PgBouncer drops
// the holders' server connections (their clients left in the middle of a
// transaction) and the locks with them.
func TestPoolerCloseWithASilentNetworkIsPrompt(t *testing.T) {
	e, proxy := newPoolerFaultEnv(t)
	db := e.open(t, WithTransactionPooler(), withCheckTimeout(time.Minute))
	ctx := context.Background()
	if _, err := AcquireAdvisoryLock(ctx, db, 106); err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, "SELECT pg_advisory_lock(107)") // a parked holder too
	proxy.SetMode(faultproxy.BlackHole)
	proxy.BlackHoleAll()
	time.Sleep(200 * time.Millisecond) // the monitor is inside a check by now (the test holds either way)
	start := time.Now()
	closed := make(chan error, 1)
	go func() { closed <- db.Close() }()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("db.Close did not return within 30s with a silent network")
	}
	t.Logf("db.Close returned after %v", time.Since(start))
	proxy.Close()
	e.waitNoAdvisoryLocks(t)
}

// Point 10: through a transaction pooler, a blocking AcquireAdvisoryLock
// polls the server; db.Close stops it at once, with an error.
func TestPoolerAcquireStopsAtClose(t *testing.T) {
	e, _ := newOwnPoolerEnv(t, pgtest.PoolerOptions{})
	db := e.open(t, WithTransactionPooler())
	blocker := otherConn(t, e.raw)
	mustExec(t, blocker, "SELECT pg_advisory_lock(99)")
	done := make(chan error, 1)
	go func() {
		l, err := AcquireAdvisoryLock(context.Background(), db, 99)
		if err == nil {
			l.Release(context.Background())
			err = errors.New("acquired")
		}
		done <- err
	}()
	time.Sleep(200 * time.Millisecond) // it polls by now (the test holds either way)
	db.Close()
	select {
	case err := <-done:
		if !strings.Contains(fmt.Sprint(err), "database was closed") {
			t.Fatalf("AcquireAdvisoryLock after db.Close: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("AcquireAdvisoryLock kept polling after db.Close")
	}
	mustExec(t, blocker, "SELECT pg_advisory_unlock(99)")
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
	pid := l.c.pid.Load()
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

// Measured after the list: the undeclared-pooler guard never sleeps. A
// session lock taken through PgBouncer's transaction mode, on a database
// not opened with WithTransactionPooler, while the pool is idle (its lock
// statement and the read after it run on the backend the connection was
// opened on, so nothing looks wrong yet): it is reported lost with
// ErrTransactionPooler at once (the monitor's first look, on another
// client connection, lands on the holder's backend; the periodic check is
// off here), before other clients share that backend; the holder's next
// statement fails, and the database refuses session locks from then on.
func TestUndeclaredPoolerWithAnIdlePoolIsReported(t *testing.T) {
	e, _ := newOwnPoolerEnv(t, pgtest.PoolerOptions{}) // idle: no other test's clients
	db := e.open(t, WithLockCheckInterval(time.Hour))
	ctx := context.Background()
	l, err := AcquireAdvisoryLock(ctx, db, 101)
	if err != nil {
		t.Fatalf("the lock through an idle pool: %v", err)
	}
	pid := l.c.pid.Load()
	t.Cleanup(func() { mustExec(t, e.raw, "SELECT pg_terminate_backend($1)", pid) }) // the stranded lock
	lostWithin(t, l, 20*time.Second)
	if !errors.Is(l.Err(), ErrTransactionPooler) || !strings.Contains(l.Err().Error(), "WithTransactionPooler") {
		t.Fatalf("Err() = %v, want ErrTransactionPooler naming the option", l.Err())
	}
	// Other clients share the backend now; the holder's work must not run.
	other, err := sql.Open("pgx", e.pooled)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	mustExec(t, other, "SELECT 1")
	if _, err := l.Conn().ExecContext(ctx, "SELECT 1"); !errors.Is(err, ErrLockLost) || !errors.Is(err, ErrTransactionPooler) {
		t.Fatalf("the holder's next statement: %v, want ErrLockLost and ErrTransactionPooler", err)
	}
	if _, err := db.ExecContext(ctx, "SELECT pg_advisory_lock(102)"); !errors.Is(err, ErrTransactionPooler) {
		t.Fatalf("a new session lock: %v, want ErrTransactionPooler", err)
	}
	if n := heldCount(t, e.raw, 102); n != 0 {
		t.Fatalf("the refused lock was taken (%d holders)", n)
	}
	l.Release(ctx)
}

// The guard at connect: a second connection of the database opens on the
// backend where the first, still open, left its marker (PgBouncer reuses
// the idle server connection): only a transaction-mode pooler does that,
// so the first connection's session lock is refused before it runs.
func TestUndeclaredPoolerSeenAtConnect(t *testing.T) {
	e, _ := newOwnPoolerEnv(t, pgtest.PoolerOptions{})
	db := e.open(t, WithLockCheckInterval(time.Hour))
	ctx := context.Background()
	c1 := otherConn(t, db)
	c2 := otherConn(t, db)
	if pid1, pid2 := trackedConn(t, c1).pid.Load(), trackedConn(t, c2).pid.Load(); pid1 != pid2 {
		t.Fatalf("the two connections opened on backends %d and %d; the test needs PgBouncer to reuse the idle one", pid1, pid2)
	}
	if _, err := c1.ExecContext(ctx, "SELECT pg_advisory_lock(103)"); !errors.Is(err, ErrTransactionPooler) {
		t.Fatalf("a session lock after the pooler was seen: %v, want ErrTransactionPooler", err)
	}
	if n := heldCount(t, e.raw, 103); n != 0 {
		t.Fatalf("the refused lock was taken (%d holders)", n)
	}
	// Transaction-level locks are fine through the pooler.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := Lock(ctx, tx, "jobs", 1); err != nil {
		t.Fatalf("Lock through the pooler: %v", err)
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
	mustExecConn(t, other, "SELECT pg_advisory_lock(107)")
	pid := pidOf(t, other)
	var incarnation string
	if err := other.QueryRowContext(ctx, "SELECT "+incarnationExpr).Scan(&incarnation); err != nil {
		t.Fatal(err)
	}
	if readIncarnation(incarnation) != incarnation {
		t.Fatalf("incarnation %q does not read as one", incarnation)
	}
	start, server, _ := strings.Cut(incarnation, "@")
	keys := []lockKey{{k1: 107}}
	for _, c := range []struct {
		what   string
		target endTarget
	}{
		{"another backend_start (a reused pid)", endTarget{pid: pid, incarnation: "1" + start + "@" + server, quiet: time.Now()}},
		{"another server (a failover)", endTarget{pid: pid, incarnation: start + "@1" + server, quiet: time.Now()}},
		{"a statement after the quiet time (another client of a pooler)", endTarget{pid: pid, incarnation: incarnation, quiet: time.Now().Add(-time.Minute)}},
		// A statement sent and never answered, within endSlack of which the
		// backend started another text: a client a session pooler gave the
		// backend to, not lockhooks' statement.
		{"another text within the slack of an unanswered statement", endTarget{pid: pid, incarnation: incarnation, quiet: time.Now().Add(-time.Minute),
			inFlight: true, sentQuiet: time.Now().Add(endSlack), sent: "SELECT 1"}},
		{"an unanswered statement whose text is not known", endTarget{pid: pid, incarnation: incarnation, quiet: time.Now().Add(-time.Minute),
			inFlight: true, sentQuiet: time.Now().Add(endSlack)}},
		{"the very text, but started after the slack", endTarget{pid: pid, incarnation: incarnation, quiet: time.Now().Add(-time.Minute),
			inFlight: true, sentQuiet: time.Now().Add(-30 * time.Second), sent: "SELECT " + incarnationExpr}},
	} {
		alive, ended, err := endBackend(ctx, side, &endRequest{target: c.target, keys: keys})
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
	alive, ended, err := endBackend(ctx, side, &endRequest{target: endTarget{pid: pid, incarnation: incarnation, quiet: time.Now().Add(-time.Minute),
		inFlight: true, sentQuiet: time.Now().Add(endSlack), sent: "SELECT " + incarnationExpr}, keys: keys})
	if err != nil || !alive || !ended {
		t.Fatalf("the named backend, running the unanswered statement: endBackend = %v, %v, %v; want it ended", alive, ended, err)
	}
	waitFor(t, 10*time.Second, "the ended backend to exit", func() bool { return !backendAlive(t, raw, pid) })

	// Another backend, quiet since its last statement: ended.
	other = otherConn(t, raw)
	mustExecConn(t, other, "SELECT pg_advisory_lock(107)")
	pid = pidOf(t, other)
	if err := other.QueryRowContext(ctx, "SELECT "+incarnationExpr).Scan(&incarnation); err != nil {
		t.Fatal(err)
	}
	alive, ended, err = endBackend(ctx, side, &endRequest{target: endTarget{pid: pid, incarnation: incarnation, quiet: time.Now()}, keys: keys})
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
	holder := l.c.pid.Load()
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
	if pid := pidOf(t, c); w.pid.Load() != pid || w.mark != "" {
		t.Fatalf("connection opened with pid %d (want %d), marker %q (want none)", w.pid.Load(), pid, w.mark)
	}
	mustExec(t, c, "SELECT pg_advisory_lock(108)")
	assertTracked(t, e.raw, w)
	if ok, err := unlock(t, c, 108); !ok || err != nil {
		t.Fatalf("unlock: %v, %v", ok, err)
	}
}

// Point 3's limit: a pooler whose server connections are all taken (the
// holder's, and another client's open transaction; default_pool_size = 2)
// keeps the monitor's check waiting for a server until the check's timeout.
// The pooler answered the connection, so the server is reachable, only
// busy: the holder is not reported lost.
func TestBusyPoolerIsNotUnreachable(t *testing.T) {
	e, _ := newOwnPoolerEnv(t, pgtest.PoolerOptions{PoolSize: 2})
	db := e.open(t, WithTransactionPooler(), withCheckTimeout(300*time.Millisecond))
	ctx := context.Background()
	l, err := AcquireAdvisoryLock(ctx, db, 109)
	if err != nil {
		t.Fatal(err)
	}
	other, err := sql.Open("pgx", e.pooled)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	busy, err := other.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Rollback()
	mustExec(t, busy, "SELECT 1") // the pool's other server connection, kept
	waitFor(t, 30*time.Second, "two checks to time out waiting for a server", func() bool {
		return strings.Count(e.log.String(), "checking advisory-lock holders failed") >= 2
	})
	select {
	case <-l.Lost():
		t.Fatalf("the holder was reported lost: %v", l.Err())
	default:
	}
	busy.Rollback()
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
