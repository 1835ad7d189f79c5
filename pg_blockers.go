package lockhooks

import (
	"context"
	"database/sql/driver"
	"fmt"
	"strconv"
	"strings"

	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/identity"
	"github.com/lockhooks/lockhooks/internal/pgserver"
	"github.com/lockhooks/lockhooks/internal/pgsession"
	"github.com/lockhooks/lockhooks/internal/rawconn"
)

// The Postgres side of the model of holders (holders*.go): who blocks whom
// as the server shows it, for the slow-wait log, the wait spans, the
// errors of waits that time out, deadlocks and the debug page. The
// backends pg_blocking_pids names, followed to the root of the chain (A
// holds, C waits for A, B waits behind C: B's holder is A, and C is queued
// ahead of it), in one query on a side connection; the model identifies
// each (holders_blockage.go, identify) by the identity it published (internal/identity)
// or as a connection of this process.

// blockedBackend is what Postgres says of one of the database's
// connections that waits on the server.
type blockedBackend struct {
	pid         int32  // the backend that waits (through a pooler, not the one the connection met at connect)
	waitEvent   string // wait_event_type/wait_event
	query       string
	waitSeconds float64           // how long its statement has run (it waits in it); -1: unknown
	blockers    []holders.Blocker // by depth: who blocks it, and whom those wait for, to the root (at most pgserver.MaxQueuedListed of them waiting)
	queuedAhead int               // how many backends block it directly while waiting themselves (queued ahead of it), listed or not
}

// blockedConns reads which of conns wait on the server and for whom, in
// one query on the database's side connection (side_conn.go; never a
// pool's). A connection is matched to the backend that runs its statement
// by the identity it published (a transaction through a pooler runs on any
// backend), or, on a connection that publishes none, by the backend pid it
// met at connect, unless a pooler is declared (that backend serves other
// clients) or the backend shows another application_name than the
// connection had (an undeclared pooler gave it to another client).
// Connections that wait for nothing are absent. Reads that overlap share
// one (blockersFlight).
func (c *connector) blockedConns(ctx context.Context, conns []*conn) (map[*conn]*blockedBackend, error) {
	if len(conns) == 0 {
		return nil, nil
	}
	all, err := c.side.sharedRead(ctx, c, conns)
	if err != nil {
		return nil, err
	}
	out := make(map[*conn]*blockedBackend, min(len(conns), len(all)))
	for _, oc := range conns {
		if bb := all[oc]; bb != nil {
			out[oc] = bb
		}
	}
	return out, nil
}

// readBlocked reads, on side, which of conns wait on the server and for
// whom (blockedConns), in one read (pgserver.BlockersQuery).
func (c *connector) readBlocked(ctx context.Context, side driver.Conn, conns []*conn) (map[*conn]*blockedBackend, error) {
	pids := []string{"0"}
	for _, oc := range conns {
		if p := oc.pin.PID.Load(); p != 0 {
			pids = append(pids, strconv.Itoa(int(p)))
		}
	}
	d := c.own.Of(side)
	waiters := "SELECT unnest('{" + strings.Join(pids, ",") + "}'::int[])"
	if d.OK() {
		waiters += "\n\tUNION SELECT pid FROM pg_stat_activity WHERE application_name LIKE '" + c.appNamePrefixOfDatabase() + "%'"
	}
	// The planner cannot know how few rows pg_blocking_pids returns: its
	// estimate of the recursive read grows with the backends asked about
	// past jit_above_cost, and compiling the plan then takes longer than
	// running it (300 ms and more, and past the lookup's timeout on a busy
	// server). JIT is off for this read only: SET LOCAL, in a transaction
	// of its own (a failure closes the side connection, which ends it).
	if err := rawconn.Exec(ctx, side, "BEGIN"); err != nil {
		return nil, fmt.Errorf("lockhooks: reading pg_blocking_pids: %w", err)
	}
	if err := rawconn.Exec(ctx, side, "SET LOCAL jit = off"); err != nil {
		return nil, fmt.Errorf("lockhooks: reading pg_blocking_pids: %w", err)
	}
	rows, err := rawconn.Query(ctx, side, pgserver.BlockersQuery(waiters), d.Args)
	var backends map[int32]*pgserver.Backend
	var order []int32
	if err == nil {
		backends, order, err = pgserver.ReadBackends(rows, c)
	}
	if err != nil {
		return nil, fmt.Errorf("lockhooks: reading pg_blocking_pids: %w", err)
	}
	if err := rawconn.Exec(ctx, side, "COMMIT"); err != nil {
		return nil, fmt.Errorf("lockhooks: reading pg_blocking_pids: %w", err)
	}
	x := c.index()
	wanted := map[*conn]bool{}
	for _, oc := range conns {
		wanted[oc] = true
	}
	out := map[*conn]*blockedBackend{}
	byIdentity := map[*conn]bool{} // out[oc] was found by oc's identity, not by its pid at connect
	for _, wpid := range order {
		w := backends[wpid]
		if !w.Asked || !w.Shown || !w.Waits() {
			continue
		}
		oc := c.backendConn(wpid, w.Row.ApplicationName, w.Query, x, true)
		if oc == nil || !wanted[oc] {
			continue // another client's backend, or a connection not asked about
		}
		identified := identity.ParseAppName(w.Row.ApplicationName) != nil
		if bb := out[oc]; bb != nil && (bb.pid == wpid || !identified || byIdentity[oc]) {
			continue // a second backend claims the connection: keep the one found first
		}
		// Its identity shows where it runs now (the pid it met at connect
		// serves another client), or it is the first backend found for it.
		out[oc] = &blockedBackend{pid: wpid, waitEvent: w.Wait, query: w.Query, waitSeconds: w.QueryAge,
			blockers: pgserver.Chain(wpid, backends), queuedAhead: w.Queued}
		byIdentity[oc] = identified
	}
	return out, nil
}

// behindInMemory is what a connection that waits in memory behind b's
// connection (for the turn of the key b's connection waits for on the
// server) waits for: the same holders, with b's connection queued ahead
// too.
func (b *blockedBackend) behindInMemory() *blockedBackend {
	x := *b
	x.queuedAhead++
	x.pid, x.waitEvent = 0, "" // it does not wait on the server itself
	return &x
}

// appNamePrefixOfDatabase is how the application_name of every connection
// of this database begins while it publishes its identity.
func (c *connector) appNamePrefixOfDatabase() string {
	return identity.AppNamePrefix + identity.ShortProcessLabel() + "#" + strconv.FormatUint(c.seq, 10) + "."
}

// connIndex is a database's open connections by number, by the backend
// pid each met at connect, and by the backend of the holder connection
// each keeps through a transaction pooler.
type connIndex struct {
	byID            map[uint64]*conn
	byPID, byHolder map[int32]*conn
}

// index returns c's open connections, indexed.
func (c *connector) index() connIndex {
	conns := c.openConns()
	x := connIndex{byID: make(map[uint64]*conn, len(conns)), byPID: make(map[int32]*conn, len(conns)), byHolder: map[int32]*conn{}}
	for _, oc := range conns {
		x.byID[oc.id] = oc
		if p := oc.pin.PID.Load(); p != 0 {
			x.byPID[p] = oc
		}
		if p := oc.pin.Hold.PID(); p != 0 {
			x.byHolder[p] = oc
		}
	}
	return x
}

// backendConn returns the connection of c whose statements backend pid
// runs, as pg_stat_activity shows the backend (application_name app, last
// statement query), or nil. A backend that shows a lockhooks identity is
// the connection it names (a transaction through a pooler runs on any
// backend); one that shows none is the holder connection a connection
// keeps through a transaction pooler, or the connection that met it at
// connect, unless c declared a transaction pooler (the backend serves
// other clients then) or the backend shows another application_name than
// the connection had (an undeclared pooler gave it to another client). A
// pid is matched only on c's server (byPID: pids are per server).
func (c *connector) backendConn(pid int32, app, query string, x connIndex, byPID bool) *conn {
	if id := identity.Decode(app, query); id != nil {
		if !id.OfThisProcess() || id.Database != c.seq {
			return nil // another process's, or another database's
		}
		return x.byID[id.Conn]
	}
	if !byPID {
		return nil
	}
	if oc := x.byHolder[pid]; oc != nil {
		return oc
	}
	oc := x.byPID[pid]
	if oc == nil || c.opts.txPooler || app != oc.pin.Who.ConnectApp {
		return nil
	}
	if c.pins != nil && c.pins.PoolerSeen() != nil {
		return nil // a transaction-mode pooler seen: the backend a connection met at connect serves other clients, as with a declared one
	}
	return oc
}

// keyHolders returns the backends other than waiter's that hold the
// advisory keys now, read on the side connection (nil if none or
// unreadable): the holders of a wait that does not wait on the server
// (through a transaction pooler, lockhooks polls with try-locks), or that
// ended before anyone looked.
func (c *connector) keyHolders(ctx context.Context, waiter *conn, keys []lockKey) []holders.Blocker {
	if len(keys) == 0 {
		return nil
	}
	var out []holders.Blocker
	c.side.Use(ctx, func(side driver.Conn) error {
		rows, err := rawconn.Query(ctx, side, pgserver.KeyHoldersQuery(pgsession.CoreKeys(keys), waiter.shownPID()), c.own.Of(side).Args)
		if err != nil {
			out = nil
			return err
		}
		out, err = pgserver.ReadKeyHolders(rows, c)
		return err
	})
	return out
}
