package lockhooks

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"
)

// monitor checks, every interval, that the holders' backends still hold
// their locks, until no connection holds any.
func (p *pinning) monitor(stop, done chan struct{}) {
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
		case <-stop:
			return
		case <-t.C:
		}
		p.mu.Lock()
		if len(p.holders) == 0 {
			p.stop = nil
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()
		var err error
		if side, err = p.check(side); err != nil {
			p.c.opts.logger.Warn("lockhooks: checking advisory-lock holders failed; will retry", "error", err)
		}
	}
}

// holderSnapshot is what the monitor knows of one holder before it asks.
type holderSnapshot struct {
	c    *conn
	pid  int32
	gen  uint64
	keys []lockKey
}

// check asks the server whether the holders' backends are alive and hold
// their locks, on a side connection of its own (never a holder's).
func (p *pinning) check(side driver.Conn) (driver.Conn, error) {
	var snaps []holderSnapshot
	for _, h := range p.snapshot() {
		h.pin.mu.Lock()
		if pid := h.lockPID(); pid != 0 && h.pin.busy == 0 && h.pin.lost == nil && len(h.pin.held) > 0 {
			s := holderSnapshot{c: h, pid: pid, gen: h.pin.gen}
			for k := range h.pin.held {
				s.keys = append(s.keys, k)
			}
			snaps = append(snaps, s)
		}
		h.pin.mu.Unlock()
	}
	p.warnParked()
	if len(snaps) == 0 {
		return side, nil
	}

	ctx, cancel := context.WithTimeout(context.Background(), p.c.opts.lockCheckTimeout)
	defer cancel()
	if side == nil {
		var err error
		if side, err = p.c.inner.Connect(ctx); err != nil {
			return nil, err
		}
	}
	pids := make([]string, len(snaps))
	for i, s := range snaps {
		pids[i] = strconv.Itoa(int(s.pid))
	}
	alive, held, err := queryAdvisoryLocks(ctx, side, "a.pid IN ("+strings.Join(pids, ",")+")")
	if err != nil {
		side.Close()
		return nil, err
	}
	for _, s := range snaps {
		s.c.pin.mu.Lock()
		changed := s.c.pin.gen != s.gen || s.c.pin.busy > 0
		s.c.pin.mu.Unlock()
		if changed {
			continue // it ran a lock statement meanwhile; look again next time
		}
		if !alive[s.pid] {
			s.c.loseLocks(fmt.Errorf("its backend (pid %d) is gone", s.pid))
			p.settle(s.c)
			continue
		}
		missing := false
		for _, k := range s.keys {
			missing = missing || !held[s.pid][k]
		}
		s.c.pin.mu.Lock()
		parked := s.c.pin.parked
		s.c.pin.mu.Unlock()
		if missing && parked {
			// Released by something lockhooks could not see (a server-side
			// function), or the backend is exiting: the parked connection
			// itself tells which. An in-use connection is read when it is
			// returned and parked.
			s.c.verifyParked()
		}
		p.settle(s.c)
	}
	return side, nil
}

// verifyParked reads pg_locks on the parked connection c: a connection
// that fails is lost, one that works makes the tracking true.
func (c *conn) verifyParked() {
	c.pin.exec.Lock()
	defer c.pin.exec.Unlock()
	c.pin.mu.Lock()
	closed := c.pin.closed
	c.pin.mu.Unlock()
	if closed {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.connector.opts.lockCheckTimeout)
	defer cancel()
	if err := c.reconcile(ctx, "unknown", nil, false); err != nil && c.connectionBroken(err) {
		c.loseLocks(err)
	}
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
		h.pin.mu.Lock()
		if h.pin.parked && !h.pin.warned && time.Since(h.pin.parkedAt) > threshold {
			h.pin.warned = true
			for k, l := range h.pin.held {
				found = append(found, longHold{h, k, l.since, l.site})
			}
		}
		h.pin.mu.Unlock()
	}
	// Logged after the mutexes are released: the application's handler may
	// be slow.
	for _, f := range found {
		held := time.Since(f.since).Round(time.Millisecond)
		p.c.events.add(eventLongHold, fmt.Sprintf("session advisory lock %s held by parked %v for %v, taken at %s", f.k, f.h, held, f.site))
		p.c.opts.logger.Warn("lockhooks: a session advisory lock is still held by a connection withdrawn from the pool; unlock it with pg_advisory_unlock through this database",
			"key", f.k.String(), "backend_pid", f.h.pid.Load(), "held_for", held.String(), "taken_at", f.site, "connection", f.h.id)
	}
}

// queryAdvisoryLocks reads, for the backends matched by where (over
// pg_stat_activity a), which are alive and which advisory locks they hold.
func queryAdvisoryLocks(ctx context.Context, c driver.Conn, where string) (alive map[int32]bool, held map[int32]map[lockKey]bool, err error) {
	q := `SELECT a.pid, l.classid::bigint, l.objid::bigint, l.objsubid::int, l.mode
FROM pg_stat_activity a LEFT JOIN pg_locks l ON l.pid = a.pid AND l.locktype = 'advisory' AND l.granted
WHERE ` + where
	rows, err := queryDirect(ctx, c, q, nil)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	alive, held = map[int32]bool{}, map[int32]map[lockKey]bool{}
	dest := make([]driver.Value, 5)
	for {
		if err := rows.Next(dest); err != nil {
			if err == io.EOF {
				return alive, held, nil
			}
			return nil, nil, err
		}
		pid := int32(asInt64(dest[0]))
		alive[pid] = true
		if dest[1] == nil {
			continue
		}
		if held[pid] == nil {
			held[pid] = map[lockKey]bool{}
		}
		held[pid][advisoryKeyOf(asInt64(dest[1]), asInt64(dest[2]), asInt64(dest[3]), dest[4])] = true
	}
}

// advisoryKeyOf names the advisory lock of a pg_locks row.
func advisoryKeyOf(classid, objid, objsubid int64, mode driver.Value) lockKey {
	k := lockKey{shared: mode == "ShareLock"}
	if objsubid == 2 {
		k.pair, k.k1, k.k2 = true, int64(int32(uint32(classid))), int64(int32(uint32(objid)))
	} else {
		k.k1 = classid<<32 | objid
	}
	return k
}

// queryDirect runs query on a raw driver connection.
func queryDirect(ctx context.Context, c driver.Conn, query string, args []driver.NamedValue) (driver.Rows, error) {
	if q, ok := c.(driver.QueryerContext); ok {
		return q.QueryContext(ctx, query, args)
	}
	s, err := c.Prepare(query)
	if err != nil {
		return nil, err
	}
	rows, err := stmtQuery(ctx, s, args)
	if err != nil {
		s.Close()
		return nil, err
	}
	return closingRows{Rows: rows, stmt: s}, nil
}

// asInt64 converts the integer values drivers return.
func asInt64(v driver.Value) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case int32:
		return int64(x)
	case int:
		return int64(x)
	case []byte:
		n, _ := strconv.ParseInt(string(x), 10, 64)
		return n
	case string:
		n, _ := strconv.ParseInt(x, 10, 64)
		return n
	}
	return 0
}

// connectionBroken reports whether err means the connection is gone, so its
// session locks are too: a driver error that is not the server's, or the
// server's own "terminating connection" and connection-exception errors:
// any FATAL (the server ends the session after it), among them 57P01
// (pg_terminate_backend), 57P05 (idle_session_timeout) and 25P03
// (idle_in_transaction_session_timeout).
func (c *conn) connectionBroken(err error) bool {
	if errors.Is(err, driver.ErrBadConn) {
		return true
	}
	var pg interface{ SQLState() string }
	if errors.As(err, &pg) {
		switch code := pg.SQLState(); {
		case strings.HasPrefix(code, "08"), code == "57P01", code == "57P02", code == "57P03", code == "57P05", code == stateIdleInTx:
			return true
		}
		return fatal(err)
	}
	if !c.suspect.Load() {
		return false
	}
	// Not the server's error: ask whether the connection is still there.
	return !c.alive()
}

// fatal reports whether a server error has severity FATAL or PANIC: the
// server ends the session after sending it. Neither pgx's *pgconn.PgError
// nor lib/pq's *pq.Error has a method for it, only string fields
// (SeverityUnlocalized, which does not depend on lc_messages, and
// Severity), read by reflection so that the root package imports no driver.
func fatal(err error) bool {
	for e := err; e != nil; e = errors.Unwrap(e) {
		v := reflect.ValueOf(e)
		for v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface {
			if v.IsNil() {
				break
			}
			v = v.Elem()
		}
		if v.Kind() != reflect.Struct {
			continue
		}
		for _, name := range [...]string{"SeverityUnlocalized", "Severity"} {
			if f := v.FieldByName(name); f.IsValid() && f.Kind() == reflect.String && f.String() != "" {
				return f.String() == "FATAL" || f.String() == "PANIC"
			}
		}
	}
	return false
}

// alive pings the connection.
func (c *conn) alive() bool {
	if c.pinger == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	return c.pinger.Ping(ctx) == nil
}

// loseLocks records that c's session locks are gone because its
// connection died, reports it (log, metric, Lost), and returns the error
// to give to whoever relied on them (nil if c held none). The caller
// settles c afterwards (a parked one is closed).
func (c *conn) loseLocks(cause error) error {
	return c.markLost("its connection died ("+cause.Error()+")", cause, true)
}

// markLost records that c's session locks are gone (why completes "…held
// advisory lock k and"); report says whether to log and count it as a loss
// (db.Close reports its own way).
func (c *conn) markLost(why string, cause error, report bool) error {
	c.pin.mu.Lock()
	if c.pin.lost != nil {
		defer c.pin.mu.Unlock()
		return c.pin.lost
	}
	if len(c.pin.held) == 0 {
		c.pin.mu.Unlock()
		return nil
	}
	keys := make([]string, 0, len(c.pin.held))
	var oldest *heldLock
	for k, l := range c.pin.held {
		keys = append(keys, k.String())
		if oldest == nil || l.since.Before(oldest.since) {
			oldest = l
		}
	}
	sort.Strings(keys)
	n := len(c.pin.held)
	c.pin.lost = fmt.Errorf("%w: %v held advisory lock %s (taken at %s, %v ago) and %s; the work it protected must stop",
		ErrLockLost, c, strings.Join(keys, ", "), oldest.site, time.Since(oldest.since).Round(time.Millisecond), why)
	c.pin.held = nil
	c.pin.gen++
	parked := c.pin.parked
	if c.pin.lostCh == nil {
		c.pin.lostCh = make(chan struct{})
	}
	lostCh, lost := c.pin.lostCh, c.pin.lost
	c.updateActiveLocked() // statements now fail with lost
	c.pin.mu.Unlock()

	if report {
		c.connector.tel.lockLost(context.Background(), "advisory", n)
		c.connector.events.add(eventLockLost, lost.Error())
		c.connector.opts.logger.Error("lockhooks: advisory lock lost", "connection", c.id, "backend_pid", c.pid.Load(),
			"keys", strings.Join(keys, ", "), "taken_at", oldest.site, "parked", parked, "cause", cause.Error())
	}
	close(lostCh) // after the log and the count, so whoever waits on Lost sees them
	return lost
}

// lostError combines the lost-lock error with the driver's error; a
// driver.ErrBadConn is not wrapped, so database/sql does not retry the
// protected work on a fresh connection.
func (c *conn) lostError(lost, err error) error {
	if lost == nil {
		return err
	}
	if errors.Is(err, driver.ErrBadConn) {
		return lost
	}
	return fmt.Errorf("%w (the statement failed with: %w)", lost, err)
}

// lostChan returns the channel closed when c's locks are lost.
func (c *conn) lostChan() <-chan struct{} {
	c.pin.mu.Lock()
	defer c.pin.mu.Unlock()
	if c.pin.lostCh == nil {
		c.pin.lostCh = make(chan struct{})
	}
	return c.pin.lostCh
}
