package lockhooks

import (
	"context"
	"database/sql"
	"fmt"
	"reflect"
	"testing"

	"github.com/lockhooks/lockhooks/internal/pgtest"
)

// On a connection to the server itself, an exact session-lock statement
// carries the holder's annotation and no pg_locks read follows it: what
// the caller sees must be what the driver alone gives, the tracking must
// stay equal to pg_locks, and whatever cannot be sent that way must keep
// the read.

// The values an annotated statement returns are the driver's own: a
// lock's void, a try-lock's and an unlock's bool, each shape of call.
func TestDirectLockStatementsAnswerAsTheDriver(t *testing.T) {
	dsn := pgtest.DSN(t)
	raw, wrapped := openRaw(t, dsn), openDSN(t, dsn)
	ctx := context.Background()
	statements := []struct {
		query string
		args  []any
	}{
		{"SELECT pg_advisory_lock($1)", []any{int64(71)}},
		{"SELECT pg_try_advisory_lock($1) AS got", []any{71}},
		{"SELECT pg_advisory_lock_shared($1, $2)", []any{int32(7), int32(1)}},
		{"SELECT pg_advisory_unlock_shared($1, $2)", []any{int32(7), int32(1)}},
		{"SELECT pg_advisory_unlock($1)", []any{uint8(71)}},
		{"SELECT pg_advisory_unlock($1)", []any{int64(71)}},
		{"SELECT pg_advisory_lock($1), $2::text AS note", []any{72, "not an integer: not annotated"}},
		{"SELECT pg_advisory_unlock($1)", []any{72}},
	}
	run := func(db *sql.DB) (out []string) {
		c, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		for _, s := range statements {
			rows, err := c.QueryContext(ctx, s.query, s.args...)
			if err != nil {
				t.Fatalf("%s: %v", s.query, err)
			}
			cols, _ := rows.Columns()
			for rows.Next() {
				vs := make([]any, len(cols))
				ptrs := make([]any, len(cols))
				for i := range vs {
					ptrs[i] = &vs[i]
				}
				if err := rows.Scan(ptrs...); err != nil {
					rows.Close()
					t.Fatal(err)
				}
				for _, v := range vs {
					out = append(out, fmt.Sprintf("%s %v: %v %T %#v", s.query, s.args, cols, v, v))
				}
			}
			if err := rows.Close(); err != nil {
				t.Fatal(err)
			}
		}
		return out
	}
	want, got := run(raw), run(wrapped)
	if !reflect.DeepEqual(want, got) {
		t.Errorf("through lockhooks:\n%q\nthe driver alone:\n%q", got, want)
	}
}

// The annotated path takes no extra round trip, keeps the tracking equal
// to pg_locks after each statement, and is left for the read where its
// conditions fail: a try-lock's outcome unseen, a key evaluated apart, a
// statement of two calls, a prepared statement.
func TestDirectLockStatementsKeepTheTracking(t *testing.T) {
	dsn := pgtest.DSN(t)
	p, proxied := startRoundTrips(t, dsn)
	raw, wrapped := openRaw(t, dsn), openDSN(t, proxied)
	ctx := context.Background()
	c, err := wrapped.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	w := trackedConn(t, c)
	if !w.direct {
		t.Fatal("a connection to the server through a TCP relay was not found direct")
	}
	pid := w.pin.PID.Load()
	trips := func(what string, want int64, run func() error) {
		t.Helper()
		before := p.of(t, pid) // (the connection's own: the monitor's first look may fall in any window)
		if err := run(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if n := p.of(t, pid) - before; n != want {
			t.Errorf("%s: %d round trips, want %d", what, n, want)
		}
		assertTracked(t, raw, w)
	}
	exec := func(q string, args ...any) func() error {
		return func() error { _, err := c.ExecContext(ctx, q, args...); return err }
	}
	trips("lock", 1, exec("SELECT pg_advisory_lock($1)", 81))
	trips("lock again", 1, exec("SELECT pg_advisory_lock($1)", int64(81)))
	trips("try-lock read as a row", 1, func() error {
		var got bool
		return c.QueryRowContext(ctx, "SELECT pg_try_advisory_lock($1)", 82).Scan(&got)
	})
	trips("try-lock run as Exec (its outcome only pg_locks tells)", 2, exec("SELECT pg_try_advisory_lock($1) AS t", 83)) // (a text of its own: see sentWith)
	trips("a key given as text (evaluated first)", 3, exec("SELECT pg_advisory_lock($1::bigint)", "84"))
	trips("two calls", 2, exec("SELECT pg_advisory_lock(85), pg_advisory_lock(86)"))
	stmt, err := c.PrepareContext(ctx, "SELECT pg_advisory_unlock($1)")
	if err != nil {
		t.Fatal(err)
	}
	defer stmt.Close()
	trips("a prepared unlock", 2, func() error { _, err := stmt.ExecContext(ctx, 81); return err })
	for _, k := range []int{81, 82, 83, 84, 85, 86} {
		trips(fmt.Sprintf("unlock %d", k), 1, exec("SELECT pg_advisory_unlock($1)", k))
	}
	if w.holdsLocks() {
		t.Fatalf("still tracked: %v", w.view().session)
	}
}

// AcquireAdvisoryLock takes the fencing token in its lock statement: the
// acquisition and the release make a round trip each, as the driver's
// lock and unlock, and Token makes none.
func TestDirectAcquireTakesTheTokenInItsLockStatement(t *testing.T) {
	dsn := pgtest.DSN(t)
	p, proxied := startRoundTrips(t, dsn)
	raw, db := openRaw(t, dsn), openDSN(t, proxied)
	ctx := context.Background()
	var last int64
	for i := range 3 {
		l, err := AcquireAdvisoryLock(ctx, db, 91) // (its round trips: TestIdentityNoExtraRoundTrip)
		if err != nil {
			t.Fatal(err)
		}
		if n := heldCount(t, raw, 91); n != 1 {
			t.Fatalf("acquisition %d: %d holders in pg_locks", i, n)
		}
		pid := l.c.pin.PID.Load()
		before := p.of(t, pid) // (the lock's connection's: the monitor looks at a new holder at once)
		token := l.Token()
		if n := p.of(t, pid) - before; n != 0 {
			t.Errorf("Token: %d round trips, want 0", n)
		}
		if token <= last {
			t.Errorf("acquisition %d: token %d, not larger than the last one's %d", i, token, last)
		}
		last = token
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if l.Token() != token {
			t.Errorf("Token after Release: %d, want %d", l.Token(), token)
		}
		if n := heldCount(t, raw, 91); n != 0 {
			t.Fatalf("released: %d holders in pg_locks", n)
		}
	}
}

// A connection is direct only where pgx's BackendKeyData names the backend
// and the user did not choose the simple protocol (the annotated
// statements go in pgx's exec mode): through PgBouncer, whatever its mode,
// every session-lock statement keeps its pg_locks read.
func TestDirectOnlyWhereTheServerAnswers(t *testing.T) {
	dsn := pgtest.DSN(t)
	ctx := context.Background()
	direct := func(dsn string) bool {
		t.Helper()
		c, err := openDSN(t, dsn).Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return trackedConn(t, c).direct
	}
	if !direct(dsn) {
		t.Error("a connection to the server is not direct")
	}
	if direct(withDSNParam(t, dsn, "default_query_exec_mode", "simple_protocol")) {
		t.Error("a connection in the simple protocol the user chose is direct")
	}
	for _, v := range pgtest.Versions {
		for _, mode := range []string{"transaction", "session"} {
			p := pgtest.StartPooler(t, pgtest.PoolerOptions{Version: v, Mode: mode})
			if direct(p.DSN(t)) {
				t.Errorf("a connection through %s in %s mode is direct", v, mode)
			}
		}
	}
}

// An annotated text the connection sends again (one key at one call site,
// no trace) is prepared once and cached, as the driver's own statements
// are: from the third hold on, a lock and its unlock take the driver's two
// round trips and no statement is prepared again; texts that change with
// every hold are never cached (TestIdentityStatementCache).
func TestDirectRepeatedLockTextIsCached(t *testing.T) {
	dsn := pgtest.DSN(t)
	p, proxied := startRoundTrips(t, dsn)
	db := openDSN(t, proxied)
	ctx := context.Background()
	c, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	prepared := func() (n int) {
		if err := c.QueryRowContext(ctx, "SELECT count(*) FROM pg_prepared_statements").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	hold := func() {
		for _, q := range []string{"SELECT pg_advisory_lock($1)", "SELECT pg_advisory_unlock($1)"} {
			if _, err := c.ExecContext(ctx, q, 42); err != nil {
				t.Fatal(err)
			}
		}
	}
	hold()
	hold()
	before, trips := prepared(), p.counts()
	for range 10 {
		hold()
	}
	if n := busiest(trips, p.counts()); n != 20 {
		t.Errorf("10 holds after two: %d round trips, want 20", n)
	}
	if after := prepared(); after != before {
		t.Errorf("pg_prepared_statements went from %d to %d", before, after)
	}
}
