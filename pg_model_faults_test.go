package lockhooks

// The differential model's fault steps: a cancelled wait, a terminated holder,
// and the faults injected between steps, with the waits they need.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// cancelledWait makes slot s wait for the blocker's key and cancels the
// wait once pg_locks shows it; pgx then closes the connection, and
// lockhooks must report any session lock it held as lost.
func (m *model) cancelledWait(i int, s *slot) {
	pid := trackedConn(m.t, s.c).pin.PID.Load()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := s.c.ExecContext(ctx, "SELECT pg_advisory_lock($1)", int64(blockedKey))
		done <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		if err := m.e.raw.QueryRow("SELECT count(*) FROM pg_locks WHERE pid = $1 AND NOT granted", pid).Scan(&n); err != nil {
			m.fail("%v", err)
		}
		if n > 0 {
			break
		}
		select {
		case err := <-done: // refused before waiting (e.g. the connection's locks were lost)
			cancel()
			if err == nil {
				m.fail("the blocked lock was granted")
			}
			s.c.Close()
			m.slots[i] = nil
			return
		default:
		}
		if time.Now().After(deadline) {
			m.fail("the lock wait never showed in pg_locks")
		}
		time.Sleep(2 * time.Millisecond)
	}
	cancel()
	if err := <-done; err == nil {
		m.fail("the cancelled lock wait returned no error")
	}
	s.c.Close() // database/sql drops the broken connection
	m.slots[i] = nil
	m.waitGone(pid)
}

// terminateHolder terminates one backend of this database that holds
// session locks, and waits until lockhooks has reported them lost.
func (m *model) terminateHolder() string {
	for _, w := range m.conn.Conns() {
		v := w.view()
		if len(v.session) == 0 || v.lost {
			continue
		}
		for i, s := range m.slots {
			if s != nil && trackedConn(m.t, s.c) == w {
				if s.tx != nil {
					continue // its transaction would also have to be followed
				}
				terminate(m.t, m.e.raw, v.pid)
				m.waitGone(v.pid)
				if _, err := s.c.ExecContext(context.Background(), "SELECT 1"); !errors.Is(err, ErrLockLost) {
					m.fail("a statement on the terminated holder slot%d: %v, want ErrLockLost", i, err)
				}
				s.c.Close()
				m.slots[i] = nil
				return fmt.Sprintf("terminate slot%d (pid %d)", i, v.pid)
			}
		}
		if !v.parked {
			continue
		}
		terminate(m.t, m.e.raw, v.pid)
		deadline := time.Now().Add(10 * time.Second)
		for !w.view().lost {
			if time.Now().After(deadline) {
				m.fail("the terminated parked holder (pid %d) was never reported lost (%s); log:\n%s", v.pid, m.state(w), m.e.log)
			}
			time.Sleep(5 * time.Millisecond)
		}
		return fmt.Sprintf("terminate a parked holder (pid %d)", v.pid)
	}
	return ""
}

// waitGone waits until backend pid has exited.
func (m *model) waitGone(pid int32) {
	deadline := time.Now().Add(10 * time.Second)
	for backendAlive(m.t, m.e.raw, pid) {
		if time.Now().After(deadline) {
			m.fail("backend %d did not exit", pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// injectFault (modelFaults) breaks one connection that a slot uses or that
// is parked: its proxy link is cut on both sides, or on the client's side
// only (half-open: the backend lives on, holding what it held), or its
// backend is terminated. A slot's next statement must then fail, with
// ErrLockLost where it held session locks, and the slot is closed; a
// parked holder must be reported lost. Either way lockhooks must end a
// backend the fault left holding locks (check sees to it).
func (m *model) injectFault() string {
	conns := m.conn.Conns()
	slices.SortFunc(conns, func(a, b *conn) int { return cmp.Compare(a.id, b.id) })
	type target struct {
		w    *conn
		slot int // -1: parked
	}
	var targets []target
	for _, w := range conns {
		v := w.view()
		if v.lost {
			continue
		}
		slot := -1
		for i, s := range m.slots {
			if s != nil && trackedConn(m.t, s.c) == w {
				slot = i
			}
		}
		if slot >= 0 || v.parked {
			targets = append(targets, target{w, slot})
		}
	}
	if len(targets) == 0 {
		return ""
	}
	tg := targets[m.rnd.IntN(len(targets))]
	v := tg.w.view()
	kind := m.rnd.IntN(3)
	if tg.slot < 0 && kind == 1 {
		kind = 0 // a half-open parked holder looks held to the server and to lockhooks alike until it is used
	}
	var port int
	if err := m.e.raw.QueryRow("SELECT client_port FROM pg_stat_activity WHERE pid = $1", v.pid).Scan(&port); err != nil {
		m.fail("client port of backend %d: %v", v.pid, err)
	}
	link := m.proxy.LinkByServerPort(port)
	if link == nil && kind != 2 {
		m.fail("no proxy link for backend %d", v.pid)
	}
	what := [...]string{"cut", "half-open", "terminate"}[kind]
	switch kind {
	case 0:
		link.Cut()
	case 1:
		link.CutClient()
	case 2:
		terminate(m.t, m.e.raw, v.pid)
	}
	if tg.slot < 0 {
		deadline := time.Now().Add(10 * time.Second)
		for !tg.w.view().lost {
			if time.Now().After(deadline) {
				m.fail("%s parked holder (pid %d) was never reported lost (%s); log:\n%s", what, v.pid, m.state(tg.w), m.e.log)
			}
			time.Sleep(5 * time.Millisecond)
		}
		return fmt.Sprintf("%s a parked holder (pid %d)", what, v.pid)
	}
	s := m.slots[tg.slot]
	var x execer = s.c
	if s.tx != nil {
		x = s.tx
	}
	_, err := x.ExecContext(context.Background(), "SELECT 1")
	switch {
	case err == nil:
		m.fail("a statement on slot%d after %s (pid %d) succeeded", tg.slot, what, v.pid)
	case len(v.session) > 0 && !errors.Is(err, ErrLockLost):
		m.fail("a statement on slot%d after %s (pid %d), which held %v: %v, want ErrLockLost", tg.slot, what, v.pid, v.session, err)
	}
	if s.tx != nil {
		s.tx.Rollback()
	}
	s.c.Close()
	m.slots[tg.slot] = nil
	return fmt.Sprintf("%s slot%d (pid %d)", what, tg.slot, v.pid)
}

// state describes what lockhooks knows of w, for a failure message.
func (m *model) state(w *conn) string {
	p := m.conn.pins
	registered, monitor := p.Registered(w), p.MonitorRunning()
	w.pin.Lock()
	defer w.pin.Unlock()
	return fmt.Sprintf("registered %v, monitor running %v, busy %d, gen %d, held %d, lost %v, pid %d, holder pid %d",
		registered, monitor, w.pin.Busy, w.pin.Gen, len(w.pin.Held), w.pin.Lost, w.pin.PID.Load(), w.pin.Hold.PID())
}
