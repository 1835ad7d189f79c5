package pgsession

import (
	"context"
	"database/sql/driver"
	"fmt"
	"strings"

	"github.com/lockhooks/lockhooks/internal/dberr"
	"github.com/lockhooks/lockhooks/internal/identity"
	"github.com/lockhooks/lockhooks/internal/pgdriver"
	"github.com/lockhooks/lockhooks/internal/rawconn"
)

// Opened is what a connection's first read said beside what its Conn
// keeps of it (Identify).
type Opened struct {
	// Server names the server its backend runs on (the server's start
	// time, the second half of the backend's incarnation); "" when the
	// server did not say.
	Server string
	// Marked: the connection's own session marker was left on its
	// backend, and Marker is the one found there before it ("" for
	// none).
	Marked bool
	Marker string
}

// Identify reads, in the one statement a Postgres connection runs at
// connect anyway, its backend pid (PID, and ReachesServer where the
// process id the server sent at connect is that pid), the
// application_name the user's configuration gave it (DSN, PGAPPNAME, the
// connector's settings: Who.ConnectApp; lockhooks publishes identities
// only where it is empty, Who.Publishes), the backend's incarnation
// (IncarnationExpr) and, for marker not "", the session marker that was
// on the backend as marker replaces it. A server that refuses the marker
// or the incarnation (one that speaks Postgres's protocol but has no
// custom settings or no pg_postmaster_start_time) is asked again without
// them: the pooler guard then works without markers, and backend pids are
// matched only within the database. own is what the driver allows
// lockhooks' own statements; the caller has checked own.OK (the
// statement is a text of the simple protocol: no statement cache).
func (c *Conn[K]) Identify(ctx context.Context, own *pgdriver.Statements, marker string) (Opened, error) {
	inner := c.host.Unwrap()
	row, err := connectRow(ctx, inner, own, marker, true)
	if err != nil && dberr.FromServer(err) && !c.host.ConnectionBroken(err) {
		row, err = connectRow(ctx, inner, own, "", false)
	}
	if err != nil {
		return Opened{}, fmt.Errorf("lockhooks: reading the backend pid of %v: %w", c.host, c.host.Observe(err))
	}
	pid := int32(pgdriver.AsInt64(row[0]))
	c.PID.Store(pid)
	if k, ok := pgdriver.BackendKeyPID(inner); ok && k == int64(pid) {
		c.ReachesServer = true
	}
	app := pgdriver.AsString(row[1])
	c.Who.ConnectApp = app
	c.Who.Publishes = app == "" || strings.HasPrefix(app, identity.AppNamePrefix)
	var got Opened
	if len(row) > 2 {
		c.Incarnation = ReadIncarnation(pgdriver.AsString(row[2]))
		_, got.Server, _ = strings.Cut(c.Incarnation, "@")
	}
	if len(row) > 3 {
		got.Marked, got.Marker = true, pgdriver.AsString(row[3])
	}
	return got, nil
}

// sessionQuery opens a connection's session where the read at connect
// could not (ReadPID): its backend pid, the marker left on the backend
// before it (by another lockhooks connection, if any), its own marker
// ($1), and the backend's incarnation.
const sessionQuery = "SELECT pg_backend_pid(), current_setting('lockhooks.session', true), set_config('lockhooks.session', $1, false), " + IncarnationExpr

// ReadPID reads the backend pid (PID) through the caller's own statements
// (Host.QueryRow), where the read at connect did not (a driver that cannot
// run Identify's text uncached), and, for marker not "", leaves marker on
// the backend and reads the marker that was there and the backend's
// incarnation (sessionQuery). A server that refuses the marker (one that
// speaks Postgres's protocol but has no custom settings) is asked for the
// pid alone: the pooler guard then works without markers.
func (c *Conn[K]) ReadPID(ctx context.Context, marker string) (Opened, error) {
	var row []driver.Value
	var err error
	if marker == "" {
		row, err = c.host.QueryRow(ctx, "SELECT pg_backend_pid()", nil)
	} else {
		row, err = c.host.QueryRow(ctx, sessionQuery, []driver.NamedValue{{Ordinal: 1, Value: marker}})
	}
	if err != nil && marker != "" && dberr.FromServer(err) && !c.host.ConnectionBroken(err) {
		row, err = c.host.QueryRow(ctx, "SELECT pg_backend_pid()", nil)
	}
	if err != nil {
		return Opened{}, fmt.Errorf("lockhooks: reading the backend pid of %v: %w", c.host, err)
	}
	switch pid := row[0].(type) {
	case int64:
		c.PID.Store(int32(pid))
	case int32:
		c.PID.Store(pid)
	default:
		return Opened{}, fmt.Errorf("lockhooks: pg_backend_pid() returned %T, want an integer", row[0])
	}
	var got Opened
	if len(row) > 3 {
		c.Incarnation = ReadIncarnation(pgdriver.AsString(row[3]))
	}
	if len(row) > 1 {
		got.Marked, got.Marker = true, pgdriver.AsString(row[1])
	}
	return got, nil
}

// connectRow runs Identify's statement: the backend pid, the
// application_name and, with server, the backend's incarnation and, with
// a marker too, the marker found on the backend as marker replaces it.
func connectRow(ctx context.Context, inner driver.Conn, own *pgdriver.Statements, marker string, server bool) ([]driver.Value, error) {
	query := "SELECT pg_backend_pid(), current_setting('application_name')"
	want := 2
	if server {
		query += ", " + IncarnationExpr
		want = 3
	}
	if server && marker != "" {
		// The marker is hex digits, a colon and a number: a literal is
		// safe, and the simple protocol caches nothing.
		query += ", current_setting('lockhooks.session', true), set_config('lockhooks.session', '" + marker + "', false)"
		want = 5
	}
	rows, err := rawconn.Query(ctx, inner, query, own.Args)
	var row *rawconn.Row
	if err == nil {
		row, err = rawconn.ReadRow(rows)
	}
	if err == nil && len(row.Values()) != want {
		err = fmt.Errorf("%d columns, want %d", len(row.Values()), want)
	}
	if err != nil {
		return nil, err
	}
	return row.Values(), nil
}
