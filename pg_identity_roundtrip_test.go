package lockhooks

// Publishing identity costs no round trip: a proxy counts the client's
// messages per backend; the statement cache and lib/pq keep working.

import (
	"context"
	"database/sql"
	"encoding/binary"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/lockhooks/lockhooks/internal/dberr"
	"github.com/lockhooks/lockhooks/internal/faultproxy"
	"github.com/lockhooks/lockhooks/internal/identity"
	"github.com/lockhooks/lockhooks/internal/pgtest"
)

// roundTrips counts, per connection through a fault proxy, the round
// trips its client starts: simple Query messages and Syncs.
type roundTrips struct {
	mu    sync.Mutex
	links []*tripLink // per proxied connection
}

// tripLink is one proxied connection: its round trips, and the backend
// pid the server sent it at connect (BackendKeyData; 0 until then).
type tripLink struct {
	trips atomic.Int64
	pid   atomic.Int32
}

// startRoundTrips starts a proxy in front of dsn's server that counts round
// trips, and returns dsn through it.
func startRoundTrips(t *testing.T, dsn string) (*roundTrips, string) {
	t.Helper()
	proxied, proxy := throughFaultProxy(t, withDSNParam(t, dsn, "sslmode", "disable")) // messageFramer reads no TLS
	p := &roundTrips{}
	proxy.OnAccept(func(l *faultproxy.Link) {
		link := &tripLink{}
		p.mu.Lock()
		p.links = append(p.links, link)
		p.mu.Unlock()
		var f messageFramer
		l.Watch(faultproxy.ToServer, func(chunk []byte) bool {
			f.feed(chunk, func(typ byte) {
				if typ == 'Q' || typ == 'S' {
					link.trips.Add(1)
				}
			})
			return true
		})
		var start []byte // what the server sent until its BackendKeyData
		l.Watch(faultproxy.ToClient, func(chunk []byte) bool {
			if start == nil && link.pid.Load() != 0 {
				return true
			}
			start = append(start, chunk...)
			for off := 0; off+5 <= len(start); {
				n := int(binary.BigEndian.Uint32(start[off+1 : off+5]))
				if n < 4 || off+1+n > len(start) {
					break
				}
				if start[off] == 'K' && n >= 8 {
					link.pid.Store(int32(binary.BigEndian.Uint32(start[off+5 : off+9])))
					start = nil
					return true
				}
				off += 1 + n
			}
			if len(start) > 1<<16 {
				start = nil // no BackendKeyData where it comes: stop looking
				link.pid.Store(-1)
			}
			return true
		})
	})
	return p, proxied
}

// of returns the round trips so far of the proxied connection whose
// backend is pid: only that connection's, never another's of the same
// database (the monitor's side connection, the lookups') that a window
// of busiest could catch at work.
func (p *roundTrips) of(t *testing.T, pid int32) int64 {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := len(p.links) - 1; i >= 0; i-- { // the newest: a pid a closed connection had may come back
		if l := p.links[i]; l.pid.Load() == pid {
			return l.trips.Load()
		}
	}
	t.Fatalf("no proxied connection has backend pid %d", pid)
	return 0
}

// counts returns each proxied connection's round trips so far.
func (p *roundTrips) counts() []int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]int64, len(p.links))
	for i, l := range p.links {
		out[i] = l.trips.Load()
	}
	return out
}

// busiest is the most round trips one connection made between before and
// after: the connection under test (lockhooks' monitor checks on a side
// connection of its own, which a total would count too).
func busiest(before, after []int64) int64 {
	var most int64
	for i, n := range after {
		if i < len(before) {
			n -= before[i]
		}
		most = max(most, n)
	}
	return most
}

// messageFramer splits what a client sends into protocol messages, fed in
// chunks cut anywhere: the startup message first (a length, no type byte;
// startRoundTrips disables TLS, so no SSLRequest precedes it), then a type
// byte and a length each.
type messageFramer struct {
	started bool
	head    [5]byte
	have    int    // bytes of head read so far
	skip    uint32 // bytes of the current message's body still to come
}

// feed reads chunk, calling message with the type of each message whose
// header it completes.
func (f *messageFramer) feed(chunk []byte, message func(typ byte)) {
	for len(chunk) > 0 {
		if f.skip > 0 {
			n := min(uint32(len(chunk)), f.skip)
			f.skip -= n
			chunk = chunk[n:]
			continue
		}
		want := 5
		if !f.started {
			want = 4
		}
		n := copy(f.head[f.have:want], chunk)
		f.have += n
		chunk = chunk[n:]
		if f.have < want {
			return
		}
		if f.started {
			message(f.head[0])
			f.skip = binary.BigEndian.Uint32(f.head[1:5]) - 4
		} else {
			f.skip = binary.BigEndian.Uint32(f.head[:4]) - 4
			f.started = true
		}
		f.have = 0
	}
}

// Publishing identities and tracking locks cost no round trip on a
// connection to the server itself: a transaction through lockhooks makes
// as many as through pgx alone (its BEGIN carries the identity), plain
// statements too, and so do a session lock and its unlock (the statements
// carry the identity, and no pg_locks read follows them), and
// AcquireAdvisoryLock with Release (no fencing token is taken unless
// Token is called).
func TestIdentityNoExtraRoundTrip(t *testing.T) {
	dsn := pgtest.DSN(t)
	p, proxied := startRoundTrips(t, dsn)
	mustExec(t, openRaw(t, dsn), "CREATE TABLE t (id int PRIMARY KEY, v int); INSERT INTO t VALUES (1, 0)")
	ctx := context.Background()
	count := func(db *sql.DB, work func(*sql.Conn)) int64 {
		t.Helper()
		c, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		work(c) // warm: pgx prepares each statement once, lockhooks'
		work(c) // annotated ones at their second sighting (sentWith)
		before := p.counts()
		for range 10 {
			work(c)
		}
		return busiest(before, p.counts())
	}
	tx := func(c *sql.Conn) {
		tx, err := c.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.ExecContext(ctx, "UPDATE t SET v = v + 1 WHERE id = $1", 1); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	plain := func(c *sql.Conn) {
		var v int
		if err := c.QueryRowContext(ctx, "SELECT v FROM t WHERE id = $1", 1).Scan(&v); err != nil {
			t.Fatal(err)
		}
	}
	lock := func(c *sql.Conn) {
		for _, q := range []string{"SELECT pg_advisory_lock($1)", "SELECT pg_advisory_unlock($1)"} {
			if _, err := c.ExecContext(ctx, q, 7); err != nil {
				t.Fatal(err)
			}
		}
	}
	raw, wrapped := openRaw(t, proxied), openDSN(t, proxied)
	for _, tc := range []struct {
		name  string
		work  func(*sql.Conn)
		extra int64
	}{{"transaction", tx, 0}, {"plain statement", plain, 0}, {"session lock and unlock", lock, 0}} {
		r, w := count(raw, tc.work), count(wrapped, tc.work)
		t.Logf("%s: %d round trips through pgx, %d through lockhooks", tc.name, r, w)
		if w != r+tc.extra {
			t.Errorf("%s: %d round trips through lockhooks, want %d (pgx alone: %d)", tc.name, w, r+tc.extra, r)
		}
	}
	acquire := func() {
		l, err := AcquireAdvisoryLock(ctx, wrapped, 8)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	acquire() // warm, twice (see count)
	acquire()
	before := p.counts()
	for range 10 {
		acquire()
	}
	if n := busiest(before, p.counts()); n != 20 {
		t.Errorf("AcquireAdvisoryLock and Release: %d round trips for 10, want 20 (the lock and the unlock)", n)
	}
}

// Identities vary with every hold, yet pgx's statement cache does not
// grow: lockhooks' own reads run in the simple protocol.
func TestIdentityStatementCache(t *testing.T) {
	db := openDSN(t, pgtest.DSN(t))
	ctx := context.Background()
	c, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	prepared := func() int {
		var n int
		if err := c.QueryRowContext(ctx, "SELECT count(*) FROM pg_prepared_statements").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	lockAt := func(k int) { // a different key and time each call
		for _, q := range []string{"SELECT pg_advisory_lock($1)", "SELECT pg_advisory_unlock($1)"} {
			if _, err := c.ExecContext(ctx, q, k); err != nil {
				t.Fatal(err)
			}
		}
	}
	lockAt(0)
	before := prepared()
	for k := 1; k < 50; k++ {
		lockAt(k)
	}
	if after := prepared(); after != before {
		t.Errorf("pg_prepared_statements grew from %d to %d over 49 holds", before, after)
	}
}

// lib/pq runs queries without arguments in the simple protocol, so
// lockhooks publishes identities through it too, with the same BEGIN and
// COMMIT.
func TestIdentityLibPQ(t *testing.T) {
	dsn := pgtest.DSN(t)
	raw := openRaw(t, dsn)
	db, err := Open("postgres", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	c, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pid := connPID(t, c)
	site := here(1)
	tx, err := c.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if app, _ := activity(t, raw, pid); identity.ParseAppName(app) == nil || !siteMatches(identity.ParseAppName(app).Site, site) {
		t.Errorf("lib/pq transaction: application_name %q", app)
	}
	if _, err := tx.Exec("SELECT 1/0"); err == nil {
		t.Fatal("1/0 worked")
	}
	if err := tx.Commit(); dberr.SQLState(err) != "25P02" {
		t.Errorf("COMMIT of an aborted transaction through lib/pq: %v", err)
	}
	site = here(1)
	if _, err := c.ExecContext(ctx, "SELECT pg_advisory_lock(9)"); err != nil {
		t.Fatal(err)
	}
	if app, query := activity(t, raw, pid); identity.Decode(app, query) == nil || identity.Decode(app, query).Site != site {
		t.Errorf("lib/pq session lock: application_name %q, statement %q", app, query)
	}
	if _, err := c.ExecContext(ctx, "SELECT pg_advisory_unlock(9)"); err != nil {
		t.Fatal(err)
	}
}
