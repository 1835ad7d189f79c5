package lockhooks

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"database/sql"

	"github.com/lockhooks/lockhooks/internal/faultproxy"
	"github.com/lockhooks/lockhooks/internal/pgtest"
)

// A parked holder reached through PgBouncer in session mode, with one
// server connection, undeclared (session mode needs no option). Its client
// connection is reset; PgBouncer resets the server connection (DISCARD
// ALL frees the lock) and gives it to the next client, which is
// lockhooks' own monitor, its check waiting for a server connection. The
// check thus runs on the backend of a connection lockhooks still counts as
// a holder: that is no transaction-mode pooler, but a holder whose
// connection died. The holder is reported lost with that cause (its reset
// socket, or the timeout reading it), not with ErrTransactionPooler; the database keeps no pooler
// verdict, so AcquireAdvisoryLock works afterwards, on that very backend;
// nothing ended it; and no advisory lock stays behind.
//
// Two ways the holder's client connection dies: reset on both sides (the
// holder's socket reads closed), and half-open (only PgBouncer's side is
// cut: the holder's socket stays open and silent, and reading the holder
// on it times out).
func TestSessionPoolerHandsParkedHoldersBackendToTheCheck(t *testing.T) {
	cuts := []struct {
		name string
		cut  func(*faultproxy.Link)
	}{
		{"reset", (*faultproxy.Link).Cut},
		{"half-open", (*faultproxy.Link).CutServer},
	}
	for _, v := range pgtest.Versions {
		for _, cut := range cuts {
			t.Run(v.String()+"/"+cut.name, func(t *testing.T) {
				ctx := context.Background()
				e, _ := newOwnPoolerEnv(t, pgtest.PoolerOptions{Version: v, Mode: "session", PoolSize: 1})
				proxied, proxy := throughFaultProxy(t, e.pooled)
				db, err := Open("pgx", withApp(proxied, e.app), WithLockCheckInterval(50*time.Millisecond),
					withCheckTimeout(time.Second), WithLogger(slog.New(slog.NewTextHandler(e.log, nil))))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { db.Close() })
				const key = 4343

				c, err := db.Conn(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := c.ExecContext(ctx, "SELECT pg_advisory_lock(4343)"); err != nil {
					t.Fatal(err)
				}
				h := stateOf(t, c)
				s1 := h.LockPID()
				link := linkOfConn(t, proxy, h)
				if err := c.Close(); err != nil { // parked: it holds the lock
					t.Fatal(err)
				}
				if !isParked(h) {
					t.Fatal("the holder was not parked")
				}
				if n := advisoryHeldBy(t, e.raw, s1, key); n != 1 {
					t.Fatalf("backend %d holds key %d %d times, want 1", s1, key, n)
				}

				cut.cut(link)
				waitFor(t, 20*time.Second, "the parked holder to be reported lost", func() bool { return lostErr(h) != nil })
				lost := lostErr(h)
				if !errors.Is(lost, ErrLockLost) || errors.Is(lost, ErrTransactionPooler) {
					t.Fatalf("the holder's loss = %v, want ErrLockLost for its dead connection, not ErrTransactionPooler\nlog:\n%s", lost, e.log)
				}
				t.Logf("reported: %v", lost)
				if perr := h.connector.pins.PoolerSeen(); perr != nil {
					t.Fatalf("a transaction-mode pooler was named: %v", perr)
				}
				if n := advisoryHeldBy(t, e.raw, s1, key); n != 0 {
					t.Fatalf("backend %d still holds key %d (%d times) after PgBouncer reset it", s1, key, n)
				}

				actx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				l, err := AcquireAdvisoryLock(actx, db, key)
				if err != nil {
					t.Fatalf("AcquireAdvisoryLock after the loss: %v\nlog:\n%s", err, e.log)
				}
				if got := l.c.LockPID(); got != s1 {
					t.Fatalf("the new lock is on backend %d, want %d (the pool's only server connection)", got, s1)
				}
				if n := advisoryHeldBy(t, e.raw, s1, key); n != 1 {
					t.Fatalf("backend %d holds key %d %d times under the new lock, want 1", s1, key, n)
				}
				if err := l.Release(ctx); err != nil {
					t.Fatal(err)
				}
				if n := advisoryHeldBy(t, e.raw, s1, key); n != 0 {
					t.Fatalf("backend %d holds key %d %d times after Release, want 0", s1, key, n)
				}
				log := e.log.String()
				if strings.Contains(log, "transaction-mode pooler") || strings.Contains(log, "ended the backend") {
					t.Errorf("the log names a transaction-mode pooler or ends a backend:\n%s", log)
				}
				if !strings.Contains(log, "advisory lock lost") {
					t.Errorf("the log does not report the loss:\n%s", log)
				}
			})
		}
	}
}

// linkOfConn returns the proxy's link that carries lockhooks connection c
// (a pgx one): the link whose client port is c's socket's local port.
func linkOfConn(t *testing.T, proxy *faultproxy.Proxy, c *conn) *faultproxy.Link {
	t.Helper()
	sc, ok := c.inner.(*stdlib.Conn)
	if !ok {
		t.Fatalf("inner connection is a %T, not pgx's", c.inner)
	}
	port := sc.Conn().PgConn().Conn().LocalAddr().(*net.TCPAddr).Port
	for _, l := range proxy.Links() {
		if l.ClientPort() == port {
			return l
		}
	}
	t.Fatalf("no proxy link from port %d", port)
	return nil
}

// isParked reports whether c is parked.
func isParked(c *conn) bool {
	c.pin.Lock()
	defer c.pin.Unlock()
	return c.pin.Parked
}

// lostErr is c's loss, or nil.
func lostErr(c *conn) error {
	c.pin.Lock()
	defer c.pin.Unlock()
	return c.pin.Lost
}

// The converse, through PgBouncer's transaction mode with an idle pool, on
// a database opened with no pooler option: a raw session lock's connection
// goes back to the pool (parked), and the monitor's first look (the
// periodic check is off) lands on its backend, which still holds the
// holder's lock, so that first look names the pooler: the holder is lost
// with ErrTransactionPooler, and the database refuses session locks.
func TestUndeclaredPoolerNamedAtFirstLookOnParkedHolder(t *testing.T) {
	e, _ := newOwnPoolerEnv(t, pgtest.PoolerOptions{}) // idle: no other test's clients
	db := e.open(t, WithLockCheckInterval(time.Hour))
	ctx := context.Background()
	c, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ExecContext(ctx, "SELECT pg_advisory_lock(103)"); err != nil {
		t.Fatalf("the lock through an idle pool: %v", err)
	}
	h := stateOf(t, c)
	pid := h.LockPID()
	t.Cleanup(func() { mustExec(t, e.raw, "SELECT pg_terminate_backend($1)", pid) }) // the stranded lock
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "the parked holder to be reported lost", func() bool { return lostErr(h) != nil })
	if lost := lostErr(h); !errors.Is(lost, ErrLockLost) || !errors.Is(lost, ErrTransactionPooler) {
		t.Fatalf("the holder's loss = %v, want ErrLockLost and ErrTransactionPooler", lost)
	}
	if _, err := db.ExecContext(ctx, "SELECT pg_advisory_lock(104)"); !errors.Is(err, ErrTransactionPooler) {
		t.Fatalf("a new session lock: %v, want ErrTransactionPooler", err)
	}
	if n := heldCount(t, e.raw, 104); n != 0 {
		t.Fatalf("the refused lock was taken (%d holders)", n)
	}
}

// The converse with the holder's lock gone from its backend: through
// PgBouncer's transaction mode, undeclared, one server connection, another
// client of the pooler resets that backend (DISCARD ALL, as some drivers
// do when they close a connection), which frees the holder's lock behind
// lockhooks' back. The monitor's check then runs on the holder's backend,
// which holds none of its locks: no proof by itself, but the holder's own
// connection still answers, which a session pooler's hand-over of a dead
// client's backend never does. The pooler is named: the holder is lost
// with ErrTransactionPooler (reported, not dropped in silence), and the
// database refuses session locks.
func TestUndeclaredPoolerNamedWhenAnotherClientResetTheBackend(t *testing.T) {
	e, _ := newOwnPoolerEnv(t, pgtest.PoolerOptions{PoolSize: 1})
	db := e.open(t, WithLockCheckInterval(50*time.Millisecond))
	ctx := context.Background()
	c, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ExecContext(ctx, "SELECT pg_advisory_lock(105)"); err != nil {
		t.Fatalf("the lock through an idle pool: %v", err)
	}
	h := stateOf(t, c)
	other, err := sql.Open("pgx", e.pooled)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := other.ExecContext(ctx, "DISCARD ALL"); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "the parked holder to be reported lost", func() bool { return lostErr(h) != nil })
	if lost := lostErr(h); !errors.Is(lost, ErrLockLost) || !errors.Is(lost, ErrTransactionPooler) {
		t.Fatalf("the holder's loss = %v, want ErrLockLost and ErrTransactionPooler", lost)
	}
	if _, err := db.ExecContext(ctx, "SELECT pg_advisory_lock(106)"); !errors.Is(err, ErrTransactionPooler) {
		t.Fatalf("a new session lock: %v, want ErrTransactionPooler", err)
	}
	if n := heldCount(t, e.raw, 105) + heldCount(t, e.raw, 106); n != 0 {
		t.Fatalf("%d advisory locks left", n)
	}
}
