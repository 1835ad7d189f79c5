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

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/lockhooks/lockhooks/internal/dberr"
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
	pid := trackedConn(t, c).pin.PID.Load()
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
	pid := trackedConn(t, c).pin.PID.Load()
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
	if attempts != 2 || len(retried) != 1 || dberr.SQLState(retried[0]) != dberr.IdleInTransactionTimeout {
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
			if !dberr.ConnectionLost(re.Err) {
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
	if dberr.SQLState(err) != "57014" {
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
