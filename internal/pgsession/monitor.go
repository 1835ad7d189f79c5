package pgsession

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
	"github.com/lockhooks/lockhooks/internal/dberr"
	"github.com/lockhooks/lockhooks/internal/pgserver"
	"github.com/lockhooks/lockhooks/internal/rawconn"
)

// monitor checks, every interval, that the holders' backends still hold
// their locks, and ends the backends of lost holders that may still hold
// them, until there is nothing more to do. Cancelling ctx (db.Close) stops
// it at once, also in the middle of a check: a silent network must not
// hold db.Close up.
func (p *Registry[K, C]) monitor(ctx context.Context, done chan struct{}) {
	defer close(done)
	var side driver.Conn
	defer func() {
		if side != nil {
			side.Close()
		}
	}()
	t := time.NewTicker(p.cfg.CheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-p.ends.Kick():
		}
		if ctx.Err() != nil {
			return // db.Close and a tick came together: no new check
		}
		p.mu.Lock()
		if p.cancelMonitor == nil {
			p.mu.Unlock()
			return // db.Close took it between the check above and here, and stops it now
		}
		if len(p.holders) == 0 && p.ends.Empty() {
			p.cancelMonitor()
			p.cancelMonitor = nil
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()
		var err error
		if side, err = p.check(ctx, side); err != nil && ctx.Err() == nil {
			p.cfg.Logger.Warn("lockhooks: checking advisory-lock holders failed; will retry", "error", err)
		}
	}
}

// holderSnapshot is what the monitor knows of one holder before it asks.
type holderSnapshot[K NamedKey, C Member[K]] struct {
	c      C
	pid    int32
	gen    uint64
	keys   []K
	parked bool
}

// check asks the server whether the holders' backends are alive and hold
// their locks, on a side connection of its own (never a holder's), and
// ends the backends of lost holders. When the server cannot be reached,
// a holder that cannot be confirmed is lost (see unreachable).
func (p *Registry[K, C]) check(ctx context.Context, side driver.Conn) (driver.Conn, error) {
	var snaps, all []holderSnapshot[K, C]
	for _, h := range p.Snapshot() {
		st := h.Session()
		st.Lock()
		if pid := h.LockPID(); pid != 0 && st.Lost == nil && len(st.Held) > 0 {
			s := holderSnapshot[K, C]{c: h, pid: pid, gen: st.Gen, parked: st.Parked}
			all = append(all, s)
			if st.Busy == 0 {
				for k := range st.Held {
					s.keys = append(s.keys, k)
				}
				snaps = append(snaps, s)
			}
		}
		st.Unlock()
	}
	p.warnParked()
	if len(snaps) == 0 && p.ends.Empty() && (p.cfg.TxPooler || len(all) == 0) {
		return side, nil // (through an undeclared pooler, a busy holder's backend is still looked for)
	}

	cctx, cancel := context.WithTimeout(ctx, p.cfg.CheckTimeout)
	defer cancel()
	v, side, err := p.ask(cctx, side, all) // all: a busy holder's backend, too, may be where the check runs (lookForPooler)
	if err != nil {
		var ue unreachableError
		if ctx.Err() == nil && errors.As(err, &ue) {
			p.unreachable(ctx, snaps, ue.err)
		}
		return nil, err
	}
	if !p.cfg.TxPooler && !p.cfg.PinningPooler {
		for _, s := range p.lookForPooler(v, all) {
			// The check ran on this parked holder's backend, and its locks
			// are gone from there: a session pooler's hand-over of a dead
			// client's backend, or a transaction pooler whose other client
			// reset it (DISCARD ALL). Only the holder's own connection can
			// tell which.
			if p.PoolerSeen() == nil && s.c.Answers(ctx) && p.stillHolding(s) {
				p.SawPooler(s.c.PoolerDetected(fmt.Sprintf("runs on backend pid %d, where lockhooks' monitor, another client, ran its check (its locks were gone from there, yet its own connection still answers)", s.pid)))
			}
			p.Settle(s.c)
		}
		if perr := p.PoolerSeen(); perr != nil {
			for _, s := range all {
				s.c.MarkLost("may no longer be held: "+perr.Error(), perr, LossReport|LossPooler)
				p.Settle(s.c)
			}
			snaps = nil
		}
	}
	for _, s := range snaps {
		if changedSince(s.c.Session(), s.gen) {
			continue // it ran a lock statement meanwhile; look again next time
		}
		if !v.Alive[s.pid] {
			s.c.MarkLost(fmt.Sprintf("its backend (pid %d) is gone", s.pid), fmt.Errorf("backend %d is gone", s.pid), LossReport)
			p.Settle(s.c)
			continue
		}
		missing := false
		for _, k := range s.keys {
			missing = missing || !v.Holds(s.pid, advisorykey.Key(k))
		}
		if missing && s.parked {
			// Released by something lockhooks could not see (a server-side
			// function), or the backend is exiting: the parked connection
			// itself tells which. An in-use connection is read when it is
			// returned and parked.
			s.c.VerifyParked(ctx)
		}
		p.Settle(s.c)
	}
	if err := p.endBackends(cctx, side); err != nil {
		side.Close()
		return nil, err
	}
	return side, nil
}

// ask reads the backends of holders (alive, and their advisory locks) on
// the side connection, opening it if needed. A side connection kept from an
// earlier check may have been ended meanwhile (idle_session_timeout, a
// pooler's server_lifetime): its failure is tried again once on a fresh
// one, so that only the server's own unreachability counts.
func (p *Registry[K, C]) ask(ctx context.Context, side driver.Conn, holders []holderSnapshot[K, C]) (v pgserver.BackendLocks, _ driver.Conn, err error) {
	pids := make([]int32, len(holders))
	for i, s := range holders {
		pids[i] = s.pid
	}
	for reused := side != nil; ; reused = false {
		if side == nil {
			if side, err = p.cfg.Connect(ctx); err != nil {
				if !dberr.FromServer(err) {
					err = unreachableError{err}
				}
				return v, nil, err
			}
		}
		if v, err = queryBackendLocks(ctx, side, pids); err == nil {
			return v, side, nil
		}
		side.Close()
		side = nil
		if !reused || ctx.Err() != nil {
			return v, nil, err
		}
	}
}

// unreachableError is a check that could not open a connection to the
// server, and got no answer from it either (refused, reset, silent within
// the check's timeout). A connection that opens but whose query then fails
// or times out is not one: the server, or the pooler, is there but busy (a
// pooler whose server connections are all taken, by lock holders among
// others), and the holders are looked at again next time.
type unreachableError struct{ err error }

func (e unreachableError) Error() string { return e.err.Error() }
func (e unreachableError) Unwrap() error { return e.err }

// stillHolding reports whether s's connection is, after the check's read,
// still a holder of locks on backend s.pid. One that released its locks
// and closed since the snapshot gave its backend back, and a session-mode
// pooler may have handed that backend to the check's side connection: not
// a transaction-mode pooler's doing. (A connection leaves the holders
// before it closes, so a backend the read met after the close is never
// taken for a holder's.)
func (p *Registry[K, C]) stillHolding(s holderSnapshot[K, C]) bool {
	p.mu.Lock()
	_, registered := p.holders[s.c]
	p.mu.Unlock()
	if !registered {
		return false
	}
	st := s.c.Session()
	st.Lock()
	defer st.Unlock()
	return len(st.Held) > 0 && st.Lost == nil && s.c.LockPID() == s.pid
}

// lookForPooler looks at where the side connection's check ran: on a
// holder's backend that still holds one of the holder's locks (busy or
// not), or on one where an open connection of this database left its
// marker, only a transaction-mode pooler puts two clients.
//
// A session-mode pooler also gives a holder's backend to another client
// (here, the check), but only once the holder's client connection is
// closed, and only after resetting it: DISCARD ALL, its default
// server_reset_query, frees the session's advisory locks. So a backend
// that holds none of the holder's locks is no proof by itself: a parked
// holder found so is returned, and the check asks its own connection
// (answers): a dead one is lost with that cause, one that still answers is
// a client the pooler serves while it gave the client's backend to
// another, which only a transaction-mode pooler does (another of its
// clients reset the backend). An in-use holder found so is left to its
// next statement. (A session pooler that does not reset its server
// connections hands a dead client's backend over with its locks, and is
// named a transaction pooler, as it always was.)
func (p *Registry[K, C]) lookForPooler(v pgserver.BackendLocks, holders []holderSnapshot[K, C]) (suspects []holderSnapshot[K, C]) {
	for _, s := range holders {
		if s.pid != v.RanOn || !p.stillHolding(s) {
			continue
		}
		if holdsOn(s.c.Session(), v, s.pid) {
			p.SawPooler(s.c.PoolerDetected(fmt.Sprintf("runs on backend pid %d, where lockhooks' monitor, another client, ran its check", s.pid)))
			return nil
		}
		if s.parked {
			suspects = append(suspects, s)
		}
	}
	if o, ok := p.OwnerOf(v.Marker); ok {
		p.SawPooler(o.PoolerDetected(fmt.Sprintf("was opened on backend pid %d, where lockhooks' monitor, another client, ran its check", v.RanOn)))
		return nil
	}
	return suspects
}

// holdsOn reports whether backend pid held, when the check read it, one
// of the session locks tracked in st.
func holdsOn[K Key](st *State[K], v pgserver.BackendLocks, pid int32) bool {
	st.Lock()
	defer st.Unlock()
	for k := range st.Held {
		if v.Holds(pid, advisorykey.Key(k)) {
			return true
		}
	}
	return false
}

// unreachable handles a check that got no answer from the server (it
// refused the connection, the network is silent, the pooler is gone): no
// reachable server means a lock cannot be assumed held. A parked holder is
// asked on its own connection, which may still work; any other holder is
// lost now (Lost fires, its next statement fails), and its backend is
// ended once the server can be reached again.
func (p *Registry[K, C]) unreachable(ctx context.Context, snaps []holderSnapshot[K, C], cause error) {
	for _, s := range snaps {
		if changedSince(s.c.Session(), s.gen) {
			continue // its own statement found out, one way or the other
		}
		if s.parked {
			s.c.VerifyParked(ctx)
		} else {
			s.c.MarkLost(fmt.Sprintf("the server could not be reached to confirm it (%v), so it cannot be assumed held", cause), cause, LossReport|LossEnd)
		}
		p.Settle(s.c)
	}
}

// changedSince reports whether st's connection ran a lock statement since
// generation gen, or runs one now.
func changedSince[K Key](st *State[K], gen uint64) bool {
	st.Lock()
	defer st.Unlock()
	return st.Gen != gen || st.Busy > 0
}

// warnParked logs locks parked longer than the threshold, once each.
func (p *Registry[K, C]) warnParked() {
	threshold := p.cfg.ParkedWarning
	if threshold <= 0 {
		return
	}
	type longHold struct {
		h     C
		k     K
		since time.Time
		site  string
	}
	var found []longHold
	for _, h := range p.Snapshot() {
		st := h.Session()
		st.Lock()
		if st.Parked && !st.Warned && time.Since(st.ParkedAt) > threshold {
			st.Warned = true
			for k, l := range st.Held {
				found = append(found, longHold{h, k, l.Since, l.Site})
			}
		}
		st.Unlock()
	}
	// Logged after the mutexes are released: the application's handler may
	// be slow.
	for _, f := range found {
		held := time.Since(f.since).Round(time.Millisecond)
		p.cfg.LongHold(fmt.Sprintf("session advisory lock %s held by parked %v for %v, taken at %s", f.k.String(), f.h, held, f.site))
		p.cfg.Logger.Warn("lockhooks: a session advisory lock is still held by a connection withdrawn from the pool; unlock it with pg_advisory_unlock through this database",
			"key", f.k.String(), "backend_pid", f.h.PID(), "held_for", held.String(), "taken_at", f.site, "connection", f.h.ID())
	}
}

// queryBackendLocks reads, on the side connection c, whether the backends
// pids are alive and which advisory locks they hold
// (pgserver.BackendLocksQuery).
func queryBackendLocks(ctx context.Context, c driver.Conn, pids []int32) (pgserver.BackendLocks, error) {
	rows, err := rawconn.Query(ctx, c, pgserver.BackendLocksQuery(pids), nil)
	if err != nil {
		return pgserver.BackendLocks{}, err
	}
	defer rows.Close()
	return pgserver.ReadBackendLocks(rows)
}

// endBackends ends, on side, each backend that still holds or awaits one
// of the keys its lost holder held or asked for: pg_terminate_backend,
// which the server permits for the role's own backends. Only the very
// backend lockhooks gave up on is hit (see EndBackend), never a pid that
// was reused, one of another server, or one a pooler gave to another
// client. A request whose backend is there but shows none of its keys is
// kept for EndPatience; one the server refuses is logged and dropped; if
// the side connection fails, the rest wait for the next round.
func (p *Registry[K, C]) endBackends(ctx context.Context, side driver.Conn) error {
	reqs := p.ends.Take()
	defer func() {
		if len(reqs) > 0 {
			p.ends.PutBack(reqs)
		}
	}()
	for pid, r := range reqs {
		alive, ended, err := EndBackend(ctx, SideQueryRow(side), r)
		switch {
		case err == nil && ended:
			delete(reqs, pid)
			p.cfg.Logger.Info("lockhooks: ended the backend of a lost advisory lock holder, which still held or awaited the lock", "backend_pid", pid)
		case err == nil && (!alive || time.Since(r.Since) > EndPatience):
			delete(reqs, pid) // gone already, another's now, or never showed the keys
		case err == nil:
			// alive and not (yet) on the keys: look again next round
		case dberr.FromServer(err) && !dberr.ConnectionLost(err):
			delete(reqs, pid)
			p.cfg.Logger.Warn("lockhooks: cannot end the backend of a lost advisory lock holder; it keeps the lock until the server notices its connection is gone",
				"backend_pid", pid, "error", err)
		default:
			return err
		}
	}
	return nil
}

// SideQueryRow runs lockhooks' own statements on side, a connection
// database/sql does not hold, for the core's reads (their first row).
func SideQueryRow(side driver.Conn) QueryRow {
	return func(ctx context.Context, query string, args []driver.NamedValue) ([]driver.Value, error) {
		rows, err := rawconn.Query(ctx, side, query, args)
		if err != nil {
			return nil, err
		}
		row, err := rawconn.ReadRow(rows)
		if err != nil {
			return nil, err
		}
		return row.Values(), nil
	}
}
