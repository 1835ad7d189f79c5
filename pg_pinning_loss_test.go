package lockhooks

// Lost session locks: a terminated holder, a loss found by the next statement
// or by the monitor on a parked connection, a cancelled lock wait, Close with
// parked locks, and the parked-lock warning and metrics.

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// The holder's backend is terminated: Lost closes, the next statement on
// the lock's connection fails with ErrLockLost, the loss is logged and
// counted.
func TestLostLockIsReported(t *testing.T) {
	e := newPinEnv(t)
	ctx := context.Background()
	l, err := AcquireAdvisoryLock(ctx, e.wrapped, 21)
	if err != nil {
		t.Fatal(err)
	}
	terminate(t, e.raw, pidOf(t, l.Conn()))
	select {
	case <-l.Lost():
	case <-time.After(10 * time.Second):
		t.Fatal("Lost() did not close after the holder's backend was terminated")
	}
	if !errors.Is(l.Err(), ErrLockLost) {
		t.Fatalf("Err() = %v", l.Err())
	}
	if _, err := l.Conn().ExecContext(ctx, "SELECT 1"); !errors.Is(err, ErrLockLost) {
		t.Fatalf("statement after the loss: %v, want ErrLockLost", err)
	}
	if err := l.Release(ctx); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Release after the loss: %v", err)
	}
	if !strings.Contains(e.log.String(), "advisory lock lost") {
		t.Errorf("no log line for the loss:\n%s", e.log)
	}
	if got := counterValue(t, e.metrics, "lockhooks.lock.lost"); got != 1 {
		t.Errorf("lockhooks.lock.lost = %d, want 1", got)
	}
	// The pool still works, on a fresh connection.
	mustExec(t, e.wrapped, "SELECT 1")
}

// Detected without any statement on the lock's connection: a statement on
// a connection whose lock is gone fails at once, even before the monitor.
func TestLostLockOnNextStatement(t *testing.T) {
	e := newPinEnv(t, WithLockCheckInterval(time.Hour))
	ctx := context.Background()
	c := otherConn(t, e.wrapped)
	mustExec(t, c, "SELECT pg_advisory_lock(22)")
	terminate(t, e.raw, pidOf(t, c))
	waitFor(t, 10*time.Second, "the backend to exit", func() bool { return heldCount(t, e.raw, 22) == 0 })
	_, err := c.ExecContext(ctx, "UPDATE nothing SET x = 1")
	if !errors.Is(err, ErrLockLost) {
		t.Fatalf("statement on the dead holder: %v, want ErrLockLost", err)
	}
	if _, err := c.ExecContext(ctx, "SELECT 1"); !errors.Is(err, ErrLockLost) {
		t.Fatalf("the next statement: %v, want ErrLockLost again", err)
	}
}

// A parked holder whose backend is terminated is detected by the monitor,
// counted, logged and closed.
func TestParkedLockLossIsDetected(t *testing.T) {
	e := newPinEnv(t)
	mustExec(t, e.wrapped, "SELECT pg_advisory_lock(23)")
	var pid int32
	if err := e.raw.QueryRow("SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objid = 23").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if got := gaugeValue(t, e.metrics, "lockhooks.advisory.parked_connections"); got != 1 {
		t.Fatalf("parked_connections = %d, want 1", got)
	}
	terminate(t, e.raw, pid)
	waitFor(t, 10*time.Second, "the loss to be counted", func() bool { return counterValue(t, e.metrics, "lockhooks.lock.lost") == 1 })
	if !strings.Contains(e.log.String(), "parked=true") {
		t.Errorf("the log does not say the holder was parked:\n%s", e.log)
	}
	if got := gaugeValue(t, e.metrics, "lockhooks.advisory.parked_connections"); got != 0 {
		t.Errorf("parked_connections = %d after the loss, want 0", got)
	}
	if _, err := unlock(t, e.wrapped, 23); !errors.Is(err, ErrNotLockOwner) {
		t.Errorf("unlock of the lost lock: %v, want ErrNotLockOwner", err)
	}
}

// A context cancelled while pg_advisory_lock waits: pgx closes the
// connection, so every lock it held is gone. The tracking must say so.
func TestCancelDuringLockWaitKeepsTrackingTrue(t *testing.T) {
	e := newPinEnv(t)
	ctx := context.Background()
	blocker := otherConn(t, e.raw)
	mustExec(t, blocker, "SELECT pg_advisory_lock(31)")

	c := otherConn(t, e.wrapped)
	mustExec(t, c, "SELECT pg_advisory_lock(30)")
	pid := pidOf(t, c)
	waitCtx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		_, err := c.ExecContext(waitCtx, "SELECT pg_advisory_lock(31)")
		errc <- err
	}()
	waitFor(t, 10*time.Second, "the lock wait", func() bool {
		var n int
		e.raw.QueryRow("SELECT count(*) FROM pg_locks WHERE pid = $1 AND NOT granted", pid).Scan(&n)
		return n == 1
	})
	cancel()
	err := <-errc
	if !errors.Is(err, ErrLockLost) {
		t.Fatalf("cancelled wait on a connection holding lock 30: %v, want ErrLockLost", err)
	}
	// The truth: the backend is gone, and with it lock 30.
	waitFor(t, 10*time.Second, "lock 30 to be released", func() bool { return heldCount(t, e.raw, 30) == 0 })
	c.Raw(func(dc any) error {
		w := dc.(connCore).state()
		w.pin.Lock()
		defer w.pin.Unlock()
		if len(w.pin.Held) != 0 {
			t.Errorf("tracking still holds %d keys", len(w.pin.Held))
		}
		return nil
	})

	// Without earlier locks: the cancelled wait leaves nothing tracked and
	// the pool usable.
	cctx, cancel2 := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel2()
	if _, err := e.wrapped.ExecContext(cctx, "SELECT pg_advisory_lock(31)"); err == nil {
		t.Fatal("the contended lock was granted")
	}
	if s := e.wrapped.Stats(); s.InUse != 1 { // c
		t.Errorf("%d connections in use", s.InUse)
	}
	if got := gaugeValue(t, e.metrics, "lockhooks.advisory.held_locks"); got != 0 {
		t.Errorf("held_locks = %d after the cancelled acquire", got)
	}
}

// db.Close releases what parked connections hold, and says so.
func TestCloseReleasesParkedLocks(t *testing.T) {
	e := newPinEnv(t)
	mustExec(t, e.wrapped, "SELECT pg_advisory_lock(41)")
	if err := e.wrapped.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the parked lock to be released", func() bool { return heldCount(t, e.raw, 41) == 0 })
	if !strings.Contains(e.log.String(), "db.Close releases") {
		t.Errorf("no log line for the release:\n%s", e.log)
	}
}

// Rerouted unlocks are counted; a parked lock older than the threshold is
// logged with its call site.
func TestParkedLockWarningAndRerouteMetric(t *testing.T) {
	e := newPinEnv(t, WithParkedLockWarning(50*time.Millisecond))
	mustExec(t, e.wrapped, "SELECT pg_advisory_lock(42)")
	waitFor(t, 10*time.Second, "the parked-lock warning", func() bool {
		return strings.Contains(e.log.String(), "still held by a connection withdrawn from the pool")
	})
	if !strings.Contains(e.log.String(), "_test.go:") {
		t.Errorf("the warning does not name the call site:\n%s", e.log)
	}
	if ok, err := unlock(t, e.wrapped, 42); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if got := counterValue(t, e.metrics, "lockhooks.advisory.unlocks_rerouted"); got != 1 {
		t.Errorf("unlocks_rerouted = %d, want 1", got)
	}
	// An unlock of a key no connection holds is refused, and counted.
	if _, err := unlock(t, e.wrapped, 42); !errors.Is(err, ErrNotLockOwner) {
		t.Fatalf("second unlock: %v, want ErrNotLockOwner", err)
	}
	if got := counterValue(t, e.metrics, "lockhooks.advisory.unlocks_refused"); got != 1 {
		t.Errorf("unlocks_refused = %d, want 1", got)
	}
}

// collect returns the metric named name.
func collect(t testing.TB, r *sdkmetric.ManualReader, name string) (metricdata.Metrics, bool) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m, true
			}
		}
	}
	return metricdata.Metrics{}, false
}

func counterValue(t testing.TB, r *sdkmetric.ManualReader, name string) int64 {
	t.Helper()
	m, ok := collect(t, r, name)
	if !ok {
		return 0
	}
	var sum int64
	for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
		sum += dp.Value
	}
	return sum
}

func gaugeValue(t testing.TB, r *sdkmetric.ManualReader, name string) int64 {
	t.Helper()
	m, ok := collect(t, r, name)
	if !ok {
		t.Fatalf("no metric %s", name)
	}
	var sum int64
	for _, dp := range m.Data.(metricdata.Gauge[int64]).DataPoints {
		sum += dp.Value
	}
	return sum
}
