package lockhooks

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/pgtest"
)

// The lock_timeout racing the grant, hunted the way it was found: a
// lock_timeout of 40ms on the DSN, a pool of one connection, an outside
// session that holds the key and lets it go around the 40ms mark, and
// thousands of attempts. Postgres may grant the lock and still raise 55P03;
// after every attempt, whatever its outcome, what lockhooks tracks must be
// what pg_locks shows for the database's backends. A key held on the
// server that lockhooks does not track is the bug: the connection goes
// back to the pool holding a lock nobody can unlock.

// grantRaceTimeout is the lock_timeout of the lockhooks side.
const grantRaceTimeout = 40 * time.Millisecond

// grantRaceKeyBase is the first attempt's key; attempt i locks base+i.
const grantRaceKeyBase = 710000

// grantRaceLanes run side by side (goroutines, not parallel subtests,
// which -parallel would bound by the machine's cores), each with its own
// pool of one connection, its own outside holder and its own keys: the
// attempts mostly wait, so lanes shorten the loop on a small machine.
const grantRaceLanes = 8

// grantRaceStats counts what the attempts met, over all lanes.
type grantRaceStats struct {
	granted, timedOut, grantedAndTimedOut, escaped atomic.Int64
}

func TestLockTimeoutRacingTheGrantNeverEscapes(t *testing.T) {
	attempts := envInt("LOCKHOOKS_GRANT_RACE_ATTEMPTS", 3000)
	if testing.Short() {
		attempts = 600
	}
	dsn := pgtest.DSN(t)
	raw, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	var stats grantRaceStats
	lanes := make([]*grantRaceLane, grantRaceLanes)
	for i := range lanes {
		lanes[i] = newGrantRaceLane(t, dsn, raw, &stats)
	}
	start := time.Now()
	errs := make(chan error, len(lanes))
	for n, l := range lanes {
		go func() {
			for i := n; i < attempts; i += len(lanes) {
				if err := l.attempt(i); err != nil {
					errs <- fmt.Errorf("lane %d: %w", n, err)
					return
				}
			}
			errs <- nil
		}()
	}
	for range lanes {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	t.Logf("%d attempts in %v: %d granted, %d lock_timeout (55P03), of which %d had taken the lock; %d escaped the tracking",
		attempts, time.Since(start).Round(time.Millisecond), stats.granted.Load(), stats.timedOut.Load(), stats.grantedAndTimedOut.Load(), stats.escaped.Load())
	if stats.grantedAndTimedOut.Load() == 0 {
		t.Log("no attempt met the race (a lock_timeout after the grant) this time")
	}
}

// grantRaceLane is one lane: a lockhooks database with a pool of one
// connection and a lock_timeout, and an outside session (raw pgx, no
// timeout) that holds each attempt's key first. Its attempts run on a
// goroutine of their own: they report through errors and t.Errorf.
type grantRaceLane struct {
	t      *testing.T
	raw    *sql.DB
	db     *sql.DB
	app    string
	conn   *connector
	holder *sql.Conn
	log    *syncBuffer // lockhooks' log, shown with a divergence
	stats  *grantRaceStats
}

func newGrantRaceLane(t *testing.T, dsn string, raw *sql.DB, stats *grantRaceStats) *grantRaceLane {
	l := &grantRaceLane{t: t, raw: raw, stats: stats, log: &syncBuffer{}, app: fmt.Sprintf("lockhooks_test_%d", appSeq.Add(1))}
	db, err := Open("pgx", withApp(dsn, l.app)+"&lock_timeout="+grantRaceTimeout.String(),
		WithLockCheckInterval(20*time.Millisecond), WithLogger(slog.New(slog.NewTextHandler(l.log, nil))))
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	l.db = db
	t.Cleanup(func() {
		db.Close()
		assertNothingLeft(t, raw, l.app)
	})
	sc, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	l.conn = trackedConn(t, sc).connector // (the pool's connection, opened before the first attempt)
	sc.Close()
	l.holder = otherConn(t, raw)
	return l
}

// attempt i: the holder takes key base+i and releases it after 30 to 50ms
// (a fixed pattern, so a run is repeatable), while lockhooks takes it by
// the attempt's way; then the tracking is compared with pg_locks and the
// key is let go, so the next attempt starts from nothing. A divergence is
// reported (t.Errorf) and cleaned up; the error stops the lane.
func (l *grantRaceLane) attempt(i int) error {
	k := int64(grantRaceKeyBase + i)
	hold := 30*time.Millisecond + time.Duration(i*7%21)*time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := l.holder.ExecContext(ctx, "SELECT pg_advisory_lock($1)", k); err != nil {
		return fmt.Errorf("the outside holder locking key %d: %w", k, err)
	}
	way := [...]string{"db.ExecContext", "db.QueryRowContext", "AcquireAdvisoryLock"}[i%3]
	what := fmt.Sprintf("attempt %d (%s of key %d, released after %v)", i, way, k, hold)
	done := make(chan error, 1)
	var lock *AdvisoryLock
	started := time.Now()
	go func() {
		var err error
		switch i % 3 {
		case 0:
			_, err = l.db.ExecContext(ctx, "SELECT pg_advisory_lock($1)", k)
		case 1:
			var v any
			err = l.db.QueryRowContext(ctx, "SELECT pg_advisory_lock($1)", k).Scan(&v)
		default:
			lock, err = AcquireAdvisoryLock(ctx, l.db, k)
		}
		done <- err
	}()
	time.Sleep(time.Until(started.Add(hold)))
	if _, err := l.holder.ExecContext(ctx, "SELECT pg_advisory_unlock($1)", k); err != nil {
		return fmt.Errorf("%s: the outside holder unlocking: %w", what, err)
	}
	err := <-done // bounded by ctx
	switch {
	case err == nil:
		l.stats.granted.Add(1)
	case IsLockNotAvailable(err):
		l.stats.timedOut.Add(1)
	default:
		return fmt.Errorf("%s: %w; want the lock or lock_timeout (55P03)", what, err)
	}
	held, herr := l.holders(k, l.app)
	if herr != nil {
		return herr
	}
	if err != nil && held > 0 {
		l.stats.grantedAndTimedOut.Add(1)
	}
	problems, derr := l.diverges()
	if derr != nil {
		return derr
	}
	if problems != "" {
		l.stats.escaped.Add(1)
		l.t.Errorf("%s, error %v: lockhooks diverges from pg_locks:\n    %s\nlockhooks' log:\n%s", what, err, problems, l.log)
		if _, err := l.db.ExecContext(ctx, "SELECT pg_advisory_unlock_all()"); err != nil { // on the pool's one connection
			return fmt.Errorf("%s: unlocking all after the divergence: %w", what, err)
		}
		return l.nothingHeld(k, what)
	}
	switch {
	case lock != nil:
		if err := lock.Release(ctx); err != nil {
			return fmt.Errorf("%s: releasing the acquired lock: %w", what, err)
		}
	case err != nil && i%3 == 2 && held > 0:
		return fmt.Errorf("%s: AcquireAdvisoryLock failed (%v) and left the key held", what, err)
	case held > 0:
		var ok bool
		if err := l.db.QueryRowContext(ctx, "SELECT pg_advisory_unlock($1)", k).Scan(&ok); !ok || err != nil {
			return fmt.Errorf("%s: the unlock through the pool: %v, %w", what, ok, err)
		}
	}
	return l.nothingHeld(k, what)
}

// nothingHeld says whether any backend still holds key k.
func (l *grantRaceLane) nothingHeld(k int64, what string) error {
	n, err := l.holders(k, "")
	if err == nil && n != 0 {
		err = fmt.Errorf("%s: key %d held by %d backends after its release", what, k, n)
	}
	return err
}

// holders returns how many backends hold key k: of application app, or
// of any ("").
func (l *grantRaceLane) holders(k int64, app string) (int, error) {
	var n int
	err := l.raw.QueryRow(`SELECT count(*) FROM pg_locks p JOIN pg_stat_activity a ON a.pid = p.pid
		WHERE p.locktype = 'advisory' AND p.granted AND ($1 = '' OR a.application_name = $1)
		AND p.objsubid = 1 AND p.classid::bigint = $2 AND p.objid::bigint = $3`, app, k>>32, k&0xffffffff).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("counting the holders of key %d: %w", k, err)
	}
	return n, nil
}

// diverges compares, as the model test does, what lockhooks tracks for
// each open connection of the lane with pg_locks for its backend, and
// looks for backends of the lane that hold advisory locks without an open
// lockhooks connection; "" when all agree.
func (l *grantRaceLane) diverges() (string, error) {
	var problems []string
	seen := map[int32]bool{}
	for _, w := range l.conn.Conns() {
		v := w.view()
		seen[v.pid] = true
		server, err := readServerLocks(l.raw, v.pid)
		if err != nil {
			return "", err
		}
		if v.lost {
			if len(server) > 0 {
				problems = append(problems, fmt.Sprintf("%v was reported lost, but its backend still holds %s", w, describeKeys(server)))
			}
			continue
		}
		if tracked := keysOf(v); describeKeys(server) != describeKeys(tracked) {
			problems = append(problems, fmt.Sprintf("%v (parked %v): lockhooks %s, pg_locks %s", w, v.parked, describeKeys(tracked), describeKeys(server)))
		}
	}
	rows, err := l.raw.Query(`SELECT DISTINCT a.pid FROM pg_stat_activity a JOIN pg_locks p ON p.pid = a.pid
		WHERE p.locktype = 'advisory' AND p.granted AND a.application_name = $1`, l.app)
	if err != nil {
		return "", fmt.Errorf("reading the lane's backends that hold advisory locks: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var pid int32
		if err := rows.Scan(&pid); err != nil {
			return "", err
		}
		if !seen[pid] {
			problems = append(problems, fmt.Sprintf("backend %d holds advisory locks but no open lockhooks connection has it", pid))
		}
	}
	return strings.Join(problems, "\n    "), rows.Err()
}

// The lock_timeout racing the grant (the waiting backend is stopped while
// the server grants it the lock and its timer expires), and then the read
// of pg_locks that must follow the failed statement fails too: another
// session holds pg_locks itself, so the read meets the same lock_timeout.
// What the backend holds is then unknown; the connection must not go back
// to the pool as if it held nothing. Its return reads pg_locks again, finds
// the key and parks it, and the unlock through the pool answers true.
func TestLockTimeoutRacingTheGrantWithAFailedReadIsNotPooled(t *testing.T) {
	e, c, pid, viewTx := grantWithFailedRead(t, 83)
	if err := viewTx.Commit(); err != nil {
		t.Fatal(err)
	}
	w := trackedConn(t, c)
	c.Close() // the return reads pg_locks: it holds the key, and is parked
	assertTracked(t, e.raw, w)
	if !pidAlive(t, e.raw, pid) {
		t.Fatal("the parked connection's backend is gone")
	}
	if ok, err := unlock(t, e.wrapped, 83); !ok || err != nil {
		t.Fatalf("unlock of the lock the timeout left behind: %v, %v", ok, err)
	}
	if n := heldCount(t, e.raw, 83); n != 0 {
		t.Fatalf("%d holders of 83 after the unlock", n)
	}
}

// The same, with pg_locks still unreadable when the connection is
// returned: it is closed instead of pooled, and its backend ends with the
// lock.
func TestLockTimeoutRacingTheGrantUnreadableIsClosed(t *testing.T) {
	e, c, pid, viewTx := grantWithFailedRead(t, 84)
	c.Close() // the return's read fails too: closed
	if err := viewTx.Commit(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the unverified connection's backend to end", func() bool { return !pidAlive(t, e.raw, pid) })
	if n := heldCount(t, e.raw, 84); n != 0 {
		t.Fatalf("%d holders of 84 after the connection was closed", n)
	}
	if !strings.Contains(e.log.String(), "closing a connection whose advisory locks could not be read") {
		t.Errorf("the close is not logged; log:\n%s", e.log)
	}
}

// grantWithFailedRead takes key k through lockhooks on a connection of its
// own while a raw session holds it, with lock_timeout 1s: the waiting
// backend is stopped, granted the lock, its timer expires, and it resumes
// to raise 55P03 with the lock held; meanwhile viewTx holds pg_locks, so
// lockhooks' read after the failure meets the lock_timeout too. It returns
// the connection (unreturned), its backend and viewTx (still open).
func grantWithFailedRead(t *testing.T, k int64) (*faultEnv, *sql.Conn, int32, *sql.Tx) {
	t.Helper()
	const timeout = time.Second
	e := newFaultEnv(t, map[string]string{"lock_timeout": timeout.String()}, WithLockCheckInterval(time.Hour))
	ctx := context.Background()
	blocker := otherConn(t, e.raw)
	mustExec(t, blocker, "SELECT pg_advisory_lock($1)", k)
	c := otherConn(t, e.wrapped)
	done := make(chan error, 1)
	go func() {
		_, err := c.ExecContext(ctx, "SELECT pg_advisory_lock($1)", k)
		done <- err
	}()
	pid := waiterOn(t, e.raw, e.app, k)
	resume := stopBackend(t, pid)
	mustExec(t, blocker, "SELECT pg_advisory_unlock($1)", k)
	waitFor(t, 20*time.Second, "the stopped waiter to be granted the lock", func() bool { return grantedTo(t, e.raw, pid, k) })
	time.Sleep(timeout + 200*time.Millisecond) // the stopped backend's timer expires (wall clock)
	viewTx, err := e.raw.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { viewTx.Rollback() })
	mustExec(t, viewTx, "LOCK TABLE pg_catalog.pg_locks IN ACCESS EXCLUSIVE MODE")
	resume()
	if err := <-done; !IsLockNotAvailable(err) {
		viewTx.Rollback()
		t.Fatalf("the lock statement: %v, want lock_not_available (55P03)", err)
	}
	if !strings.Contains(e.log.String(), "cannot read pg_locks") {
		viewTx.Rollback()
		t.Fatalf("the read after the failure did not fail; log:\n%s", e.log)
	}
	return e, c, pid, viewTx
}
