package pgblocking

import (
	"context"
	"database/sql/driver"
	"fmt"
	"strconv"
	"strings"

	"github.com/lockhooks/lockhooks/internal/identity"
	"github.com/lockhooks/lockhooks/internal/pgserver"
	"github.com/lockhooks/lockhooks/internal/rawconn"
)

// read reads, on side, which of conns wait on the server and for whom
// (Blocked), in one read (pgserver.BlockersQuery).
func (r *Reader[C]) read(ctx context.Context, side driver.Conn, conns []C) (map[C]*Wait, error) {
	pids := []string{"0"}
	for _, oc := range conns {
		if p := oc.PID(); p != 0 {
			pids = append(pids, strconv.Itoa(int(p)))
		}
	}
	d := r.cfg.Own.Of(side)
	waiters := "SELECT unnest('{" + strings.Join(pids, ",") + "}'::int[])"
	if d.OK() {
		waiters += "\n\tUNION SELECT pid FROM pg_stat_activity WHERE application_name LIKE '" + r.appNamePrefix() + "%'"
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
		backends, order, err = pgserver.ReadBackends(rows, r.cfg.SeenBy)
	}
	if err != nil {
		return nil, fmt.Errorf("lockhooks: reading pg_blocking_pids: %w", err)
	}
	if err := rawconn.Exec(ctx, side, "COMMIT"); err != nil {
		return nil, fmt.Errorf("lockhooks: reading pg_blocking_pids: %w", err)
	}
	x := r.index()
	wanted := map[C]bool{}
	for _, oc := range conns {
		wanted[oc] = true
	}
	out := map[C]*Wait{}
	byIdentity := map[C]bool{} // out[oc] was found by oc's identity, not by its pid at connect
	for _, wpid := range order {
		w := backends[wpid]
		if !w.Asked || !w.Shown || !w.Waits() {
			continue
		}
		oc, ok := r.connOf(wpid, w.Row.ApplicationName, w.Query, x, true)
		if !ok || !wanted[oc] {
			continue // another client's backend, or a connection not asked about
		}
		identified := identity.ParseAppName(w.Row.ApplicationName) != nil
		if bw := out[oc]; bw != nil && (bw.PID == wpid || !identified || byIdentity[oc]) {
			continue // a second backend claims the connection: keep the one found first
		}
		// Its identity shows where it runs now (the pid it met at connect
		// serves another client), or it is the first backend found for it.
		out[oc] = &Wait{PID: wpid, WaitEvent: w.Wait, Query: w.Query, WaitSeconds: w.QueryAge,
			Blockers: pgserver.Chain(wpid, backends), QueuedAhead: w.Queued}
		byIdentity[oc] = identified
	}
	return out, nil
}

// appNamePrefix is how the application_name of every connection of the
// database begins while it publishes its identity.
func (r *Reader[C]) appNamePrefix() string {
	return identity.AppNamePrefix + identity.ShortProcessLabel() + "#" + strconv.FormatUint(r.cfg.Database(), 10) + "."
}
