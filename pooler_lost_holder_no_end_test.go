package lockhooks

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/pgtest"
)

// A holder reached through PgBouncer in session mode (which needs no
// option, so it is tried undeclared and with WithSessionPinningPooler)
// loses its client connection. PgBouncer resets the server connection
// (DISCARD ALL frees the lock) and hands it to the next client, replica B,
// which takes the freed key: exactly what the other replicas of a leader
// election do. When A reaches the server again it must not end that
// backend, which is B's now: lockhooks never ends a backend it reached
// through a pooler, whatever the backend ran since. Three ways A can lose
// the connection:
//   - idle: A's last statement was answered long before;
//   - answer lost: A's protected UPDATE ran on the server and its answer
//     was lost, and B then runs the very same text;
//   - slow link: 100 ms each way between A and PgBouncer, so A hears its
//     last answer a round trip after the server sent it, and B starts its
//     own statement at once.
//
// In every case B keeps its lock and its backend, A reports its own loss,
// and A's log says that the backend was left to the server.
func TestPoolerLostHolderNeverEndsAnotherClientsBackend(t *testing.T) {
	cases := []struct {
		name  string
		delay time.Duration // each way, between A and PgBouncer
		// lose makes A lose its connections while l is held.
		lose  func(t *testing.T, a *poolerLoss)
		bStmt string // what B runs on the backend after it took the key
	}{
		{name: "idle", lose: func(t *testing.T, a *poolerLoss) { a.cut(t) }, bStmt: "SELECT 1"},
		{name: "answer lost, same text", lose: func(t *testing.T, a *poolerLoss) { a.updateUnanswered(t); a.cut(t) }, bStmt: jobUpdate},
		{name: "slow link", delay: 100 * time.Millisecond, lose: func(t *testing.T, a *poolerLoss) { a.update(t); a.cut(t) }, bStmt: "SELECT count(*) FROM pg_class"},
	}
	for _, declared := range []bool{false, true} {
		for _, c := range cases {
			name := c.name + "/undeclared"
			if declared {
				name = c.name + "/WithSessionPinningPooler"
			}
			t.Run(name, func(t *testing.T) {
				a := startPoolerLoss(t, declared, c.delay)
				c.lose(t, a)
				select {
				case <-a.l.Lost():
				case <-time.After(20 * time.Second):
					t.Fatal("A's lock was not reported lost")
				}
				if err := a.l.Err(); !errors.Is(err, ErrLockLost) {
					t.Fatalf("A's Err() = %v, want ErrLockLost", err)
				}
				bc := a.takeOverByB(t)
				if _, err := bc.ExecContext(context.Background(), c.bStmt, jobArgs(c.bStmt)...); err != nil {
					t.Fatal(err)
				}
				a.reconnect(t)

				var one int
				if err := bc.QueryRowContext(context.Background(), "SELECT 1").Scan(&one); err != nil {
					t.Fatalf("B's connection (backend %d, which A's lost holder used before the pooler gave it to B) was ended by A's lockhooks: %v\nA's log:\n%s", a.s1, err, a.e.log)
				}
				if n := advisoryHeldBy(t, a.e.raw, a.s1, a.key); n != 1 {
					t.Fatalf("backend %d (B's) holds key %d %d times after A reconnected, want 1\nA's log:\n%s", a.s1, a.key, n, a.e.log)
				}
				log := a.e.log.String()
				if !strings.Contains(log, "advisory lock lost") || !strings.Contains(log, "left to the server's own timeouts") {
					t.Errorf("A's log does not report the loss, or does not say the backend was left to the server:\n%s", log)
				}
				if strings.Contains(log, "ended the backend") {
					t.Errorf("A's log says it ended a backend:\n%s", log)
				}
				if err := a.l.Release(context.Background()); !errors.Is(err, ErrLockLost) {
					t.Errorf("Release of the lost lock = %v, want ErrLockLost", err)
				}
				if _, err := bc.ExecContext(context.Background(), "SELECT pg_advisory_unlock($1)", a.key); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

// jobUpdate is the protected work of the lost-holder tests: the same text
// for A and B, as two replicas of one service send.
const jobUpdate = "UPDATE jobs SET n = n + 1 WHERE id = $1"

// jobArgs is the argument list of stmt: one id for jobUpdate.
func jobArgs(stmt string) []any {
	if stmt == jobUpdate {
		return []any{1}
	}
	return nil
}

// poolerLoss is replica A of the lost-holder tests: a lockhooks database
// that reaches PgBouncer (session mode, three server connections, as the
// incident had) through a fault-injecting proxy, and holds key with an
// AdvisoryLock on backend s1.
type poolerLoss struct {
	e     *poolerEnv
	proxy interface {
		Refuse()
		CutAll()
		DropAnswersAll()
		Listen() error
	}
	db  *sql.DB
	l   *AdvisoryLock
	key int64
	s1  int32
}

func startPoolerLoss(t *testing.T, declared bool, delay time.Duration) *poolerLoss {
	t.Helper()
	e, _ := newOwnPoolerEnv(t, pgtest.PoolerOptions{Mode: "session", PoolSize: 3})
	mustExec(t, e.raw, "CREATE TABLE jobs (id int PRIMARY KEY, n int NOT NULL)")
	mustExec(t, e.raw, "INSERT INTO jobs VALUES (1, 0)")
	proxied, proxy := throughFaultProxy(t, e.pooled)
	proxy.SetDelay(delay)
	opts := []Option{WithLockCheckInterval(50 * time.Millisecond), withCheckTimeout(2 * time.Second),
		WithLogger(slog.New(slog.NewTextHandler(e.log, nil)))}
	if declared {
		opts = append(opts, WithSessionPinningPooler())
	}
	db, err := Open("pgx", withApp(proxied, e.app), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	a := &poolerLoss{e: e, proxy: proxy, db: db, key: 4242}
	if a.l, err = AcquireAdvisoryLock(context.Background(), db, a.key); err != nil {
		t.Fatal(err)
	}
	a.s1 = a.l.c.LockPID()
	var holder int32
	if err := e.raw.QueryRow("SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objid = $1 AND granted", a.key).Scan(&holder); err != nil || holder != a.s1 {
		t.Fatalf("lock on backend %d (%v), lockhooks says %d", holder, err, a.s1)
	}
	return a
}

// update runs the protected work on the lock's connection.
func (a *poolerLoss) update(t *testing.T) {
	t.Helper()
	if _, err := a.l.Conn().ExecContext(context.Background(), jobUpdate, 1); err != nil {
		t.Fatal(err)
	}
}

// updateUnanswered runs the protected work with every answer to A lost:
// it runs on the server (seen in the table), and A never hears of it.
func (a *poolerLoss) updateUnanswered(t *testing.T) {
	t.Helper()
	var before int
	if err := a.e.raw.QueryRow("SELECT n FROM jobs WHERE id = 1").Scan(&before); err != nil {
		t.Fatal(err)
	}
	a.proxy.DropAnswersAll()
	done := make(chan error, 1)
	go func() {
		_, err := a.l.Conn().ExecContext(context.Background(), jobUpdate, 1)
		done <- err
	}()
	waitFor(t, 10*time.Second, "A's unanswered UPDATE to run on the server", func() bool {
		var n int
		if err := a.e.raw.QueryRow("SELECT n FROM jobs WHERE id = 1").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == before+1
	})
	t.Cleanup(func() {
		select {
		case err := <-done:
			if err == nil {
				t.Error("A's UPDATE, whose answer was lost, succeeded")
			}
		case <-time.After(30 * time.Second):
			t.Error("A's unanswered UPDATE never returned")
		}
	})
}

// cut takes A's network to the pooler away: its client connections are
// reset, and new ones refused until reconnect.
func (a *poolerLoss) cut(t *testing.T) {
	a.proxy.Refuse()
	a.proxy.CutAll()
}

// takeOverByB waits for PgBouncer to reset A's former server connection,
// and returns a connection of replica B (a raw client of the pooler) on
// it, holding the freed key.
func (a *poolerLoss) takeOverByB(t *testing.T) *sql.Conn {
	t.Helper()
	ctx := context.Background()
	waitFor(t, 10*time.Second, "PgBouncer to reset A's server connection", func() bool {
		var q string
		if err := a.e.raw.QueryRow("SELECT query FROM pg_stat_activity WHERE pid = $1", a.s1).Scan(&q); err != nil {
			t.Skipf("PgBouncer closed backend %d instead of resetting it (%v)", a.s1, err)
		}
		return q == "DISCARD ALL"
	})
	b, err := sql.Open("pgx", a.e.pooled)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	var bc *sql.Conn
	var others []*sql.Conn
	for range 3 {
		c, err := b.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var pid int32
		if err := c.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			t.Fatal(err)
		}
		if pid == a.s1 {
			bc = c
			break
		}
		others = append(others, c)
	}
	for _, c := range others {
		c.Close()
	}
	if bc == nil {
		t.Skipf("B never got backend %d", a.s1)
	}
	t.Cleanup(func() { bc.Close() })
	if _, err := bc.ExecContext(ctx, "SELECT pg_advisory_lock($1)", a.key); err != nil {
		t.Fatal(err)
	}
	return bc
}

// reconnect gives A its network back and waits until its monitor has
// handled its queue of backends to end and stopped.
func (a *poolerLoss) reconnect(t *testing.T) {
	t.Helper()
	if err := a.proxy.Listen(); err != nil {
		t.Fatal(err)
	}
	pins := a.l.c.connector.pins
	waitFor(t, 20*time.Second, "A's monitor to handle its end queue and stop", pins.Idle)
}

// advisoryHeldBy is how many times backend pid holds advisory key (a
// single bigint key: classid 0), per pg_locks.
func advisoryHeldBy(t *testing.T, raw *sql.DB, pid int32, key int64) int {
	t.Helper()
	var n int
	if err := raw.QueryRow("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND pid = $1 AND objid = $2 AND classid = 0", pid, key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
