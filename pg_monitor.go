package lockhooks

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
func (p *pinning) monitor(ctx context.Context, done chan struct{}) {
	defer close(done)
	var side driver.Conn
	defer func() {
		if side != nil {
			side.Close()
		}
	}()
	t := time.NewTicker(p.c.opts.lockCheckInterval)
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
			p.c.opts.logger.Warn("lockhooks: checking advisory-lock holders failed; will retry", "error", err)
		}
	}
}

// holderSnapshot is what the monitor knows of one holder before it asks.
type holderSnapshot struct {
	c      *conn
	pid    int32
	gen    uint64
	keys   []lockKey
	parked bool
}

// check asks the server whether the holders' backends are alive and hold
// their locks, on a side connection of its own (never a holder's), and
// ends the backends of lost holders. When the server cannot be reached,
// a holder that cannot be confirmed is lost (see unreachable).
func (p *pinning) check(ctx context.Context, side driver.Conn) (driver.Conn, error) {
	var snaps, all []holderSnapshot
	for _, h := range p.snapshot() {
		h.pin.Lock()
		if pid := h.lockPID(); pid != 0 && h.pin.Lost == nil && len(h.pin.Held) > 0 {
			s := holderSnapshot{c: h, pid: pid, gen: h.pin.Gen, parked: h.pin.Parked}
			all = append(all, s)
			if h.pin.Busy == 0 {
				for k := range h.pin.Held {
					s.keys = append(s.keys, k)
				}
				snaps = append(snaps, s)
			}
		}
		h.pin.Unlock()
	}
	p.warnParked()
	if len(snaps) == 0 && p.ends.Empty() && (p.c.opts.txPooler || len(all) == 0) {
		return side, nil // (through an undeclared pooler, a busy holder's backend is still looked for)
	}

	cctx, cancel := context.WithTimeout(ctx, p.c.opts.lockCheckTimeout)
	defer cancel()
	v, side, err := p.ask(cctx, side, all) // all: a busy holder's backend, too, may be where the check runs (lookForPooler)
	if err != nil {
		var ue unreachableError
		if ctx.Err() == nil && errors.As(err, &ue) {
			p.unreachable(ctx, snaps, ue.err)
		}
		return nil, err
	}
	if !p.c.opts.txPooler && !p.c.opts.pinningPooler {
		for _, s := range p.lookForPooler(v, all) {
			// The check ran on this parked holder's backend, and its locks
			// are gone from there: a session pooler's hand-over of a dead
			// client's backend, or a transaction pooler whose other client
			// reset it (DISCARD ALL). Only the holder's own connection can
			// tell which.
			if p.poolerSeen() == nil && s.c.answers(ctx) && p.stillHolding(s) {
				p.sawPooler(s.c.poolerDetected(fmt.Sprintf("runs on backend pid %d, where lockhooks' monitor, another client, ran its check (its locks were gone from there, yet its own connection still answers)", s.pid)))
			}
			p.settle(s.c)
		}
		if perr := p.poolerSeen(); perr != nil {
			for _, s := range all {
				s.c.markLost("may no longer be held: "+perr.Error(), perr, lossReport|lossPooler)
				p.settle(s.c)
			}
			snaps = nil
		}
	}
	for _, s := range snaps {
		if s.c.changedSince(s.gen) {
			continue // it ran a lock statement meanwhile; look again next time
		}
		if !v.Alive[s.pid] {
			s.c.markLost(fmt.Sprintf("its backend (pid %d) is gone", s.pid), fmt.Errorf("backend %d is gone", s.pid), lossReport)
			p.settle(s.c)
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
			s.c.verifyParked(ctx)
		}
		p.settle(s.c)
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
func (p *pinning) ask(ctx context.Context, side driver.Conn, holders []holderSnapshot) (v pgserver.BackendLocks, _ driver.Conn, err error) {
	pids := make([]int32, len(holders))
	for i, s := range holders {
		pids[i] = s.pid
	}
	for reused := side != nil; ; reused = false {
		if side == nil {
			if side, err = p.c.inner.Connect(ctx); err != nil {
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
func (p *pinning) stillHolding(s holderSnapshot) bool {
	p.mu.Lock()
	_, registered := p.holders[s.c]
	p.mu.Unlock()
	if !registered {
		return false
	}
	s.c.pin.Lock()
	defer s.c.pin.Unlock()
	return len(s.c.pin.Held) > 0 && s.c.pin.Lost == nil && s.c.lockPID() == s.pid
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
func (p *pinning) lookForPooler(v pgserver.BackendLocks, holders []holderSnapshot) (suspects []holderSnapshot) {
	for _, s := range holders {
		if s.pid != v.RanOn || !p.stillHolding(s) {
			continue
		}
		if s.c.holdsOn(v, s.pid) {
			p.sawPooler(s.c.poolerDetected(fmt.Sprintf("runs on backend pid %d, where lockhooks' monitor, another client, ran its check", s.pid)))
			return nil
		}
		if s.parked {
			suspects = append(suspects, s)
		}
	}
	if o := p.ownerOf(v.Marker); o != nil {
		p.sawPooler(o.poolerDetected(fmt.Sprintf("was opened on backend pid %d, where lockhooks' monitor, another client, ran its check", v.RanOn)))
		return nil
	}
	return suspects
}

// holdsOn reports whether backend pid held, when the check read it, one
// of the session locks lockhooks tracks on c.
func (c *conn) holdsOn(v pgserver.BackendLocks, pid int32) bool {
	c.pin.Lock()
	defer c.pin.Unlock()
	for k := range c.pin.Held {
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
func (p *pinning) unreachable(ctx context.Context, snaps []holderSnapshot, cause error) {
	for _, s := range snaps {
		if s.c.changedSince(s.gen) {
			continue // its own statement found out, one way or the other
		}
		if s.parked {
			s.c.verifyParked(ctx)
		} else {
			s.c.markLost(fmt.Sprintf("the server could not be reached to confirm it (%v), so it cannot be assumed held", cause), cause, lossReport|lossEnd)
		}
		p.settle(s.c)
	}
}

// changedSince reports whether c ran a lock statement since generation gen,
// or runs one now.
func (c *conn) changedSince(gen uint64) bool {
	c.pin.Lock()
	defer c.pin.Unlock()
	return c.pin.Gen != gen || c.pin.Busy > 0
}

// answers reports whether the parked connection c still answers a
// statement of lockhooks' own (a read, on whatever backend a pooler gives
// it); one whose connection broke (a reset, or silence past the check
// timeout) is lost with that cause. It changes nothing of c's tracking
// otherwise.
func (c *conn) answers(ctx context.Context) bool {
	return c.onParked(ctx, func(ctx context.Context) error { return c.execOwn(ctx, "SELECT 1") })
}

// verifyParked reads pg_locks on the parked connection c: a connection
// that fails is lost, one that works makes the tracking true.
func (c *conn) verifyParked(ctx context.Context) {
	c.onParked(ctx, func(ctx context.Context) error { return c.reconcile(ctx, "unknown", nil, false) })
}

// onParked runs run, lockhooks' own statements, on the parked connection c
// under its exec lock and bounded by the check timeout, unless c was closed
// meanwhile; a failure because the connection broke loses c's locks with
// that cause. It reports whether run ran and succeeded.
func (c *conn) onParked(ctx context.Context, run func(context.Context) error) bool {
	c.pin.exec.Lock()
	defer c.pin.exec.Unlock()
	c.pin.Lock()
	closed := c.pin.Closed
	c.pin.Unlock()
	if closed {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, c.connector.opts.lockCheckTimeout)
	defer cancel()
	if err := run(ctx); err != nil {
		if !dberr.FromServer(err) || c.connectionBroken(err) {
			c.loseLocks(err)
		}
		return false
	}
	return true
}

// warnParked logs locks parked longer than the threshold, once each.
func (p *pinning) warnParked() {
	threshold := p.c.opts.parkedWarning
	if threshold <= 0 {
		return
	}
	type longHold struct {
		h     *conn
		k     lockKey
		since time.Time
		site  string
	}
	var found []longHold
	for _, h := range p.snapshot() {
		h.pin.Lock()
		if h.pin.Parked && !h.pin.Warned && time.Since(h.pin.ParkedAt) > threshold {
			h.pin.Warned = true
			for k, l := range h.pin.Held {
				found = append(found, longHold{h, k, l.Since, l.Site})
			}
		}
		h.pin.Unlock()
	}
	// Logged after the mutexes are released: the application's handler may
	// be slow.
	for _, f := range found {
		held := time.Since(f.since).Round(time.Millisecond)
		p.c.events.Add(eventLongHold, fmt.Sprintf("session advisory lock %s held by parked %v for %v, taken at %s", f.k, f.h, held, f.site))
		p.c.opts.logger.Warn("lockhooks: a session advisory lock is still held by a connection withdrawn from the pool; unlock it with pg_advisory_unlock through this database",
			"key", f.k.String(), "backend_pid", f.h.pid.Load(), "held_for", held.String(), "taken_at", f.site, "connection", f.h.id)
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
