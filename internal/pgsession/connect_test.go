package pgsession

import (
	"io"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/lockhooks/lockhooks/internal/pgdriver"
	"github.com/lockhooks/lockhooks/internal/pgtest"
	"github.com/lockhooks/lockhooks/internal/rawconn"
)

// The read at connect against a real server: the pid (the backend's own,
// so the connection reaches the server), the application_name the DSN
// left empty (so it publishes), the backend's incarnation and the server
// it names, and the marker: the one left before by another connection
// is read as this one's replaces it; without a marker, none is left.
func TestIdentifyReadsTheBackend(t *testing.T) {
	ctx, c, h := reconcileEnv(t, Settings{})
	got, err := c.Identify(ctx, c.set.Own, "")
	if err != nil {
		t.Fatal(err)
	}
	var pid int32
	if err := h.raw.QueryRowContext(ctx, "SELECT pid FROM pg_stat_activity WHERE application_name = '' AND pid <> pg_backend_pid() AND backend_type = 'client backend' AND pid = $1", c.PID.Load()).Scan(&pid); err != nil || pid == 0 {
		t.Fatalf("pid %d is not a client backend of the server: %v", c.PID.Load(), err)
	}
	if !c.ReachesServer || c.Who.ConnectApp != "" || !c.Who.Publishes {
		t.Errorf("reaches %v, app %q, publishes %v", c.ReachesServer, c.Who.ConnectApp, c.Who.Publishes)
	}
	if c.Incarnation == "" || got.Server == "" || !strings.HasSuffix(c.Incarnation, "@"+got.Server) || got.Marked {
		t.Errorf("incarnation %q, server %q, marked %v", c.Incarnation, got.Server, got.Marked)
	}

	if err := rawconn.Exec(ctx, h.inner, "SELECT set_config('lockhooks.session', 'before:1', false)"); err != nil {
		t.Fatal(err)
	}
	got, err = c.Identify(ctx, c.set.Own, "after:2")
	if err != nil || !got.Marked || got.Marker != "before:1" {
		t.Fatalf("with a marker: %+v, %v", got, err)
	}
	v, err := h.QueryValue(ctx, "SELECT current_setting('lockhooks.session')")
	if err != nil || v != "after:2" {
		t.Errorf("the marker left: %v, %v", v, err)
	}

	// A user's application_name is theirs: nothing is published.
	if err := rawconn.Exec(ctx, h.inner, "SET application_name = 'billing'"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Identify(ctx, c.set.Own, ""); err != nil || c.Who.ConnectApp != "billing" || c.Who.Publishes {
		t.Errorf("a user's name: %q, publishes %v, %v", c.Who.ConnectApp, c.Who.Publishes, err)
	}
}

// A server that refuses part of the read (here: a role that may not call
// pg_postmaster_start_time(), in this test's database only) is asked
// again without the incarnation and the marker: the pid and the
// application_name are read, nothing is marked, no server is named.
func TestIdentifyWithoutWhatTheServerRefuses(t *testing.T) {
	ctx, raw, _ := holderEnv(t)
	var db string
	if err := raw.QueryRowContext(ctx, "SELECT current_database()").Scan(&db); err != nil {
		t.Fatal(err)
	}
	role := "refused_" + strconv.FormatInt(time.Now().UnixNano()%1e9, 10)
	for _, q := range []string{"CREATE ROLE " + role + " LOGIN", "REVOKE EXECUTE ON FUNCTION pg_postmaster_start_time() FROM PUBLIC"} {
		if _, err := raw.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { raw.Exec("DROP ROLE " + role) })
	u, err := url.Parse(pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	u.Path, u.User = "/"+db, url.User(role)
	inner, err := stdlib.GetDefaultDriver().Open(u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer inner.Close()
	h := &testHost{inner: inner, raw: raw, ends: NewEndQueue()}
	h.c = new(Conn[namedKey])
	set := Settings{Own: new(pgdriver.Statements), CheckTimeout: 10 * time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	set.Own.Of(inner)
	h.c.Init(&set, h)
	got, err := h.c.Identify(ctx, set.Own, "mine:1")
	if err != nil {
		t.Fatal(err)
	}
	if got.Marked || got.Server != "" || h.c.Incarnation != "" || h.c.PID.Load() == 0 || !h.c.Who.Publishes {
		t.Errorf("refused: %+v, incarnation %q, pid %d, publishes %v", got, h.c.Incarnation, h.c.PID.Load(), h.c.Who.Publishes)
	}
}

// The pid read later, through the caller's own statements: with a
// marker, the one found is read as the connection's replaces it, with the
// incarnation; without, the pid alone.
func TestReadPID(t *testing.T) {
	ctx, c, h := reconcileEnv(t, Settings{})
	got, err := c.ReadPID(ctx, "")
	if err != nil || got.Marked || c.PID.Load() == 0 || c.Incarnation != "" {
		t.Fatalf("without a marker: %+v, pid %d, incarnation %q, %v", got, c.PID.Load(), c.Incarnation, err)
	}
	pid := c.PID.Load()
	if err := rawconn.Exec(ctx, h.inner, "SELECT set_config('lockhooks.session', 'before:1', false)"); err != nil {
		t.Fatal(err)
	}
	got, err = c.ReadPID(ctx, "after:2")
	if err != nil || !got.Marked || got.Marker != "before:1" || c.PID.Load() != pid || c.Incarnation == "" {
		t.Fatalf("with a marker: %+v, pid %d (was %d), incarnation %q, %v", got, c.PID.Load(), pid, c.Incarnation, err)
	}
	if v, err := h.QueryValue(ctx, "SELECT current_setting('lockhooks.session')"); err != nil || v != "after:2" {
		t.Errorf("the marker left: %v, %v", v, err)
	}
}
