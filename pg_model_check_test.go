package lockhooks

// The differential model's checks: lockhooks' view against pg_locks after every
// step, and the drain that must leave nothing held.

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/lockhooks/lockhooks/internal/pgsession"
)

// check compares lockhooks' view of every open connection with pg_locks.
// Only the loss monitor works asynchronously (a parked holder's backend
// that died); a connection it has reported lost is skipped.
func (m *model) check(when string) {
	var problems []string
	deadline := time.Now().Add(2 * time.Second)
	for {
		problems = problems[:0]
		seen := map[int32]bool{}
		for _, w := range m.conn.Conns() {
			v := w.view()
			if m.kind == modelPooled && w.pin.Hold.PID() == 0 {
				// No holder: the connection holds no session lock, and the
				// backend it was opened on is the pooler's, shared.
				if len(v.session) > 0 && !v.lost {
					problems = append(problems, fmt.Sprintf("%v tracks %v without a holder", w, v.session))
				}
				continue
			}
			seen[v.pid] = true
			if v.lost {
				// Reported lost: its backend must be gone (or going), so it
				// holds nothing; otherwise the report was false.
				if held := serverLocks(m.t, m.e.raw, v.pid); len(held) > 0 {
					problems = append(problems, fmt.Sprintf("%v was reported lost, but its backend still holds %s", w, describeKeys(held)))
				}
				continue
			}
			server, tracked := serverLocks(m.t, m.e.raw, v.pid), keysOf(v)
			if describeKeys(server) != describeKeys(tracked) {
				problems = append(problems, fmt.Sprintf("%v (parked %v): lockhooks %s, pg_locks %s", w, v.parked, describeKeys(tracked), describeKeys(server)))
			}
		}
		// A backend lockhooks no longer knows must hold nothing (it may be
		// exiting after its connection was closed).
		rows, err := m.e.raw.Query(`SELECT DISTINCT a.pid FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid
			WHERE l.locktype = 'advisory' AND a.application_name = $1`, m.e.app)
		if err != nil {
			m.fail("%v", err)
		}
		for rows.Next() {
			var pid int32
			rows.Scan(&pid)
			if !seen[pid] {
				problems = append(problems, fmt.Sprintf("backend %d holds advisory locks but no open lockhooks connection has it", pid))
			}
		}
		rows.Close()
		if len(problems) == 0 {
			return
		}
		if time.Now().After(deadline) {
			m.fail("%s: lockhooks diverges from pg_locks:\n    %s", when, strings.Join(problems, "\n    "))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// unlockTimes unlocks k n times on on, each unlock answering true; for a
// count that may be off (approx: a statement lockhooks could not read ran
// while k was held, and pg_locks shows no counts) it unlocks until the
// server says k is released.
func (m *model) unlockTimes(on execer, k lockKey, n int, approx bool, who string) {
	q, args := pgsession.UnlockQuery(k)
	vals := make([]any, len(args))
	for a := range args {
		vals[a] = args[a].Value
	}
	ctx := context.Background()
	if approx {
		for j := 0; j <= 10; j++ {
			var ok bool
			if err := on.QueryRowContext(ctx, q, vals...).Scan(&ok); err != nil || !ok {
				return
			}
		}
		return
	}
	for j := range n {
		var ok bool
		if err := on.QueryRowContext(ctx, q, vals...).Scan(&ok); err != nil || !ok {
			m.fail("drain: unlock %d of %d of %s on %s: %v, %v (the count was wrong)", j+1, n, k, who, ok, err)
		}
	}
}

// drain ends the slots' transactions, unlocks every session lock as many
// times as lockhooks counted (each must answer true), and then nothing of
// this database may be held.
func (m *model) drain() {
	for i, s := range m.slots {
		if s != nil && s.tx != nil {
			s.tx.Rollback()
			s.tx = nil
			m.history = append(m.history, fmt.Sprintf("slot%d: Rollback (drain)", i))
		}
	}
	m.check("after the drain's rollbacks")
	// A slot's locks are unlocked on the slot; parked connections' through
	// the pool, where a rerouted unlock of a shared key may release any of
	// its parked holders, so those are counted per key over all of them.
	parked, parkedApprox := map[lockKey]int{}, map[lockKey]bool{}
	for _, w := range m.conn.Conns() {
		v := w.view()
		if v.lost || len(v.session) == 0 {
			continue
		}
		var on execer
		for _, s := range m.slots {
			if s != nil && trackedConn(m.t, s.c) == w {
				on = s.c
			}
		}
		if on == nil && !v.parked {
			m.fail("connection %v holds %v but is neither parked nor in a slot", w, v.session)
		}
		for k, n := range v.session {
			if on == nil {
				parked[k] += n
				parkedApprox[k] = parkedApprox[k] || v.approx[k]
				continue
			}
			m.unlockTimes(on, k, n, v.approx[k], w.String())
		}
	}
	for k, n := range parked {
		m.unlockTimes(m.e.wrapped, k, n, parkedApprox[k], "the parked connections")
	}
	var n int
	if err := m.e.raw.QueryRow(`SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND a.application_name = $1`, m.e.app).Scan(&n); err != nil {
		m.fail("%v", err)
	}
	if n != 0 {
		var left []string
		rows, err := m.e.raw.Query(`SELECT l.pid, l.classid, l.objid, l.objsubid, l.mode FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
			WHERE l.locktype = 'advisory' AND a.application_name = $1`, m.e.app)
		if err == nil {
			for rows.Next() {
				var pid, class, obj, sub int64
				var mode string
				rows.Scan(&pid, &class, &obj, &sub, &mode)
				left = append(left, fmt.Sprintf("pid %d: %d/%d/%d %s", pid, class, obj, sub, mode))
			}
			rows.Close()
		}
		var views []string
		for _, w := range m.conn.Conns() {
			views = append(views, fmt.Sprintf("%v: %+v", w, w.view()))
		}
		m.fail("after unlocking every counted lock, %d advisory locks are still held: %v\nlockhooks' views: %v", n, left, views)
	}
}
