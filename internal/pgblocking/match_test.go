package pgblocking

import (
	"testing"

	"github.com/lockhooks/lockhooks/internal/identity"
)

// testConn is a connection as the reader sees it.
type testConn struct {
	id          uint64
	pid, holder int32
	app         string
}

func (c *testConn) ID() uint64         { return c.id }
func (c *testConn) PID() int32         { return c.pid }
func (c *testConn) HolderPID() int32   { return c.holder }
func (c *testConn) ConnectApp() string { return c.app }

// A backend is a connection of the database by the identity it shows
// (this process, this database), else by the holder it is, else by the
// backend the connection met at connect, unless that backend may serve
// other clients (a pooler declared or seen, another application_name) or
// is on another server.
func TestConnOfMatchesIdentityThenHolderThenPID(t *testing.T) {
	a := &testConn{id: 1, pid: 101, app: "svc"}
	b := &testConn{id: 2, pid: 102, holder: 202}
	seen := false
	cfg := Config[*testConn]{Database: func() uint64 { return 7 }, Conns: func() []*testConn { return []*testConn{a, b} }, PoolerSeen: func() bool { return seen }}
	r := New(cfg)
	app := func(process string, db, conn uint64) string {
		return (&identity.Holder{Process: process, Database: db, Conn: conn, Holds: "tx"}).AppName()
	}
	here := identity.ProcessLabel()
	cases := []struct {
		name  string
		pid   int32
		app   string
		byPID bool
		want  *testConn
	}{
		{"its identity", 999, app(here, 7, 2), false, b},
		{"another database's identity", 102, app(here, 8, 2), true, nil},
		{"another process's identity", 102, app("elsewhere/1:x", 7, 2), true, nil},
		{"an identity of no open connection", 102, app(here, 7, 9), true, nil},
		{"its pid at connect", 101, "svc", true, a},
		{"its pid, another application_name", 101, "other", true, nil},
		{"its pid on another server", 101, "svc", false, nil},
		{"its holder's backend", 202, "", true, b},
		{"nobody's pid", 303, "", true, nil},
	}
	check := func(r *Reader[*testConn], name string, pid int32, app string, byPID bool, want *testConn) {
		t.Helper()
		got, ok := r.ConnOf(pid, app, "", byPID)
		if ok != (want != nil) || got != want {
			t.Errorf("%s: ConnOf(%d, %q) = %v, %v; want %v", name, pid, app, got, ok, want)
		}
	}
	for _, c := range cases {
		check(r, c.name, c.pid, c.app, c.byPID, c.want)
	}

	// Through a pooler, declared or seen, the pid a connection met at
	// connect serves others; identities and holders still match.
	pooled := cfg
	pooled.TxPooler = true
	for _, p := range []struct {
		r    *Reader[*testConn]
		seen bool
	}{{New(pooled), false}, {r, true}} {
		seen = p.seen
		check(p.r, "its pid through a pooler", 101, "svc", true, nil)
		check(p.r, "its holder through a pooler", 202, "", true, b)
		check(p.r, "its identity through a pooler", 101, app(here, 7, 1), true, a)
	}
}

// A connection behind another in memory waits for the same holders, with
// that one queued ahead, and does not wait on the server itself.
func TestBehindInMemory(t *testing.T) {
	w := &Wait{PID: 5, WaitEvent: "Lock/advisory", QueuedAhead: 2, WaitSeconds: 1}
	x := w.BehindInMemory()
	if x.PID != 0 || x.WaitEvent != "" || x.QueuedAhead != 3 || x.WaitSeconds != 1 || w.QueuedAhead != 2 {
		t.Errorf("behind %+v: %+v", w, x)
	}
}
