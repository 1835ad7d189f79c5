package lockhooks

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Lost locks: telling a broken connection from a failed statement,
// recording and reporting a loss, and ending on the server the backend of a
// holder lockhooks gave up on, so that the key is truly free.

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

// How markLost treats a loss.
type lossFlags uint8

const (
	// lossReport logs and counts the loss (db.Close reports its own way).
	lossReport lossFlags = 1 << iota
	// lossEnd ends the backend on the server, where it may still live
	// (its socket half-open, or a connection lockhooks gave up on): the
	// key is free only once it is gone.
	lossEnd
	// lossPooler: the locks are lost to a transaction-mode pooler; the
	// error wraps ErrTransactionPooler too.
	lossPooler
)

// loseLocks records that c's session locks are gone because its
// connection died, reports it (log, metric, Lost), has the backend ended
// where it still lives, and returns the error to give to whoever relied on
// them (nil if c held none). The caller settles c afterwards (a parked one
// is closed).
func (c *conn) loseLocks(cause error) error {
	c.endTransactionLocks()
	return c.markLost("its connection died ("+cause.Error()+")", cause, lossReport|lossEnd)
}

// endTransactionLocks has the backend of a connection that died inside a
// transaction ended where it still holds the transaction-level locks
// lockhooks saw the transaction take: a half-open connection's backend
// keeps its transaction, and them, open until TCP keepalive. (Through a
// transaction pooler the transaction's backend is the pooler's to drop.)
func (c *conn) endTransactionLocks() {
	if c.connector.pins == nil || c.connector.opts.txPooler || c.connector.opts.pinningPooler {
		return
	}
	c.pin.mu.Lock()
	var keys []lockKey
	for k, n := range c.pin.xact {
		if n > 0 {
			keys = append(keys, k)
		}
	}
	c.pin.mu.Unlock()
	if pid := c.pid.Load(); pid != 0 && len(keys) > 0 {
		c.connector.pins.ends.add(pid, keys, false)
	}
}

// markLost records that the session locks of c's lock backend are gone
// (why completes "…held advisory lock k and").
func (c *conn) markLost(why string, cause error, flags lossFlags) error {
	return c.markLostOn(c.lockPID(), why, cause, flags)
}

// markLostOn is markLost for the locks held by backend pid (a transaction
// pooler's holder whose pid the caller read before dropping it).
func (c *conn) markLostOn(pid int32, why string, cause error, flags lossFlags) error {
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
	held := make([]lockKey, 0, len(c.pin.held))
	var oldest *heldLock
	for k, l := range c.pin.held {
		keys = append(keys, k.String())
		held = append(held, k)
		if oldest == nil || l.since.Before(oldest.since) {
			oldest = l
		}
	}
	sort.Strings(keys)
	n := len(c.pin.held)
	c.pin.lost = fmt.Errorf("%w: %v held advisory lock %s (taken at %s, %v ago) and %s; the work it protected must stop",
		ErrLockLost, c, strings.Join(keys, ", "), oldest.site, time.Since(oldest.since).Round(time.Millisecond), why)
	if flags&lossPooler != 0 {
		c.pin.lost = fmt.Errorf("%w (%w)", c.pin.lost, ErrTransactionPooler)
	}
	c.pin.held = nil
	c.pin.gen++
	parked := c.pin.parked
	if c.pin.lostCh == nil {
		c.pin.lostCh = make(chan struct{})
	}
	lostCh, lost := c.pin.lostCh, c.pin.lost
	c.updateActiveLocked() // statements now fail with lost
	c.pin.mu.Unlock()

	if flags&lossEnd != 0 && pid != 0 {
		c.connector.pins.ends.add(pid, held, false)
	}
	if flags&lossReport != 0 {
		c.connector.tel.lockLost(context.Background(), "advisory", n)
		c.connector.events.add(eventLockLost, lost.Error())
		heldFor := time.Since(oldest.since).Round(time.Millisecond)
		c.connector.opts.logger.Error("lockhooks: advisory lock lost", "database", c.connector.pool, "connection", c.id, "backend_pid", pid,
			"keys", strings.Join(keys, ", "), "taken_at", oldest.site, "held_for", heldFor.String(), "parked", parked, "cause", cause.Error())
		// A span of its own (issue 20: the model of holders), linked to the
		// span the lock was taken in.
		h := connHolder(c)
		h.Key, h.Site, h.Since, h.SiteKind = strings.Join(keys, ", "), oldest.site, oldest.since, siteTook
		c.connector.tel.lockLostSpan(h.withSpan(oldest.span), cause)
	}
	if l := c.advisory.Load(); l != nil {
		l.freeTurn() // another acquirer of this process may take the key at once
	}
	close(lostCh) // after the log, the count and the turn, so whoever waits on Lost sees them
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

// endQueue is the backends of lost holders still to be ended on the
// server, by the monitor, on its side connection. Its mutex is a leaf: it
// is taken with any other held, and nothing is taken under it.
type endQueue struct {
	mu      sync.Mutex
	pending map[int32]*endRequest // by backend pid
	kick    chan struct{}         // wakes the monitor (buffered, one; see pinning.wakeMonitor)
}

// endRequest asks for a backend to be ended if it holds or awaits one of
// keys (any advisory lock, with any).
type endRequest struct {
	keys  []lockKey
	any   bool
	since time.Time
}

// endPatience is how long a request waits for its backend to show one of
// its keys in pg_locks: the backend of a connection that broke while its
// lock statement was on the way may reach the lock after the monitor first
// looks. A backend that is gone, or ended, ends the request at once.
const endPatience = 10 * time.Second

func newEndQueue() *endQueue {
	return &endQueue{pending: map[int32]*endRequest{}, kick: make(chan struct{}, 1)}
}

// add asks for backend pid to be ended if it holds or awaits one of keys,
// or, with any, any advisory lock.
func (q *endQueue) add(pid int32, keys []lockKey, any bool) {
	q.mu.Lock()
	r := q.pending[pid]
	if r == nil {
		r = &endRequest{since: time.Now()}
		q.pending[pid] = r
	}
	r.keys = append(r.keys, keys...)
	r.any = r.any || any
	q.mu.Unlock()
	select {
	case q.kick <- struct{}{}: // wake the monitor
	default:
	}
}

// empty reports whether nothing waits to be ended.
func (q *endQueue) empty() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.pending) == 0
}

// take removes and returns what waits to be ended.
func (q *endQueue) take() map[int32]*endRequest {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := q.pending
	q.pending = map[int32]*endRequest{}
	return out
}

// putBack returns requests not yet carried out, for the monitor's next
// round.
func (q *endQueue) putBack(reqs map[int32]*endRequest) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for pid, r := range reqs {
		if cur := q.pending[pid]; cur != nil {
			cur.keys = append(cur.keys, r.keys...)
			cur.any = cur.any || r.any
			continue
		}
		q.pending[pid] = r
	}
}

// endBackends ends, on side, each backend that still holds or awaits one
// of the keys its lost holder held or asked for: pg_terminate_backend,
// which the server permits for the role's own backends. The condition on
// pg_locks keeps a backend pid that exited and was reused from being hit.
// A request whose backend is alive but shows none of its keys is kept for
// endPatience; one the server refuses is logged and dropped; if the side
// connection fails, the rest wait for the next round.
func (p *pinning) endBackends(ctx context.Context, side driver.Conn) error {
	reqs := p.ends.take()
	defer func() {
		if len(reqs) > 0 {
			p.ends.putBack(reqs)
		}
	}()
	for pid, r := range reqs {
		alive, ended, err := endBackend(ctx, side, pid, r)
		switch {
		case err == nil && ended:
			delete(reqs, pid)
			p.c.opts.logger.Info("lockhooks: ended the backend of a lost advisory lock holder, which still held or awaited the lock", "backend_pid", pid)
		case err == nil && (!alive || time.Since(r.since) > endPatience):
			delete(reqs, pid) // gone already, or never showed the keys
		case err == nil:
			// alive and not (yet) on the keys: look again next round
		case isServerError(err) && !connectionLost(err):
			delete(reqs, pid)
			p.c.opts.logger.Warn("lockhooks: cannot end the backend of a lost advisory lock holder; it keeps the lock until the server notices its connection is gone",
				"backend_pid", pid, "error", err)
		default:
			return err
		}
	}
	return nil
}

// endBackend ends backend pid if it holds or awaits one of r's keys, and
// says whether it was alive and whether it was ended.
func endBackend(ctx context.Context, side driver.Conn, pid int32, r *endRequest) (alive, ended bool, err error) {
	match := ""
	if !r.any {
		ids := make([]string, len(r.keys))
		for i, k := range r.keys {
			class, obj, sub := k.pgLocksID()
			ids[i] = fmt.Sprintf("(%d, %d, %d)", class, obj, sub)
		}
		if len(ids) == 0 {
			return false, false, nil
		}
		match = " AND (classid::bigint, objid::bigint, objsubid::int) IN (" + strings.Join(ids, ", ") + ")"
	}
	p := strconv.Itoa(int(pid))
	q := `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = ` + p + `),
CASE WHEN EXISTS (SELECT 1 FROM pg_locks WHERE pid = ` + p + ` AND locktype = 'advisory'` + match + `)
THEN pg_terminate_backend(` + p + `) ELSE false END`
	rows, err := queryDirect(ctx, side, q, nil)
	if err != nil {
		return false, false, err
	}
	row, err := readStaticRow(rows)
	if err != nil || len(row.row) != 2 {
		return false, false, err
	}
	alive, _ = row.row[0].(bool)
	ended, _ = row.row[1].(bool)
	return alive, ended, nil
}

// pgLocksID returns k's (classid, objid, objsubid) in pg_locks.
func (k lockKey) pgLocksID() (classid, objid int64, objsubid int) {
	if k.pair {
		return int64(uint32(int32(k.k1))), int64(uint32(int32(k.k2))), 2
	}
	return int64(uint64(k.k1) >> 32), k.k1 & 0xffffffff, 1
}
