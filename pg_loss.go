package lockhooks

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/lockhooks/lockhooks/internal/dberr"
	"github.com/lockhooks/lockhooks/internal/holders"
)

// Lost locks: telling a broken connection from a failed statement,
// recording and reporting a loss, and ending on the server the backend of a
// holder lockhooks gave up on, so that the key is truly free.
//
// The rule for ending a backend: lockhooks ends one only where it can prove
// that no other client can have used it since lockhooks last did.
//   - The connection reached the server itself: the process id the server
//     sent at connect is the backend's own pid (see conn.reachesServer), and
//     no pooler is declared or was seen. Through any pooler, session or
//     transaction mode, declared or not, a backend serves other clients once
//     lockhooks' client connection is gone (PgBouncer resets it with DISCARD
//     ALL and hands it on), so nothing is ever ended there. A pooler that
//     forwards the server's own BackendKeyData (Pgpool-II) cannot be told
//     from the server this way: it must be declared.
//   - It is the same incarnation of the pid (its backend_start and its
//     server's start time): never a reused pid, never another server's.
//   - It has started no statement since lockhooks' last one could have
//     reached it: quiet is measured from when lockhooks sent that statement
//     (plus endSlack, its time on the way), never from when the answer came
//     back, which on a slow link is a round trip later.
//   - It still holds or awaits one of the lost keys.
// Where the proof is missing the loss is reported all the same, and the
// backend left to the server's own timeouts (TCP keepalive,
// idle_session_timeout); the log line says which.

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
		case strings.HasPrefix(code, "08"), code == "57P01", code == "57P02", code == "57P03", code == "57P05", code == dberr.IdleInTransactionTimeout:
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
	s := dberr.Field(err, "SeverityUnlocalized")
	if s == "" {
		s = dberr.Field(err, "Severity")
	}
	return s == "FATAL" || s == "PANIC"
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
	if c.connector.pins == nil || !c.endable() {
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
	if t := c.endTarget(); t.pid != 0 && len(keys) > 0 {
		c.connector.pins.ends.add(t, keys, false)
	}
}

// markLost records that the session locks of c's lock backend are gone
// (why completes "…held advisory lock k and").
func (c *conn) markLost(why string, cause error, flags lossFlags) error {
	return c.markLostOn(c.lockPID(), why, cause, flags)
}

// markLostOn is markLost for the locks held by backend pid (a transaction
// pooler's holder whose pid the caller read before dropping it). With
// lossEnd, the backend is ended where it still holds or awaits them, only
// where the rule at the top of this file allows it: a pooled backend serves
// other clients once lockhooks' client connection is gone, and the pooler
// resets it (which frees session locks) or closes it.
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
	lostCh, parked := c.setLostLocked()
	lost := c.pin.lost
	c.pin.mu.Unlock()

	// What becomes of the backend, for the log line.
	backend := "left to the server's own timeouts"
	switch {
	case flags&lossEnd != 0 && pid != 0 && pid == c.pid.Load() && c.endable() && c.incarnation != "":
		c.connector.pins.ends.add(c.endTarget(), held, false)
		backend = "ended where it still holds or awaits the lock"
	case c.throughPooler():
		backend += " (a pooler stands between lockhooks and the server: the backend may serve another client by now)"
	case !c.reachesServer:
		backend += " (the driver does not show that the connection reached the server itself)"
	}
	if flags&lossReport != 0 {
		c.reportLoss(pid, strings.Join(keys, ", "), n, oldest, parked, lost, cause, backend)
	}
	if l := c.advisory.Load(); l != nil {
		l.freeTurn() // another acquirer of this process may take the key at once
	}
	close(lostCh) // after the log, the count and the turn, so whoever waits on Lost sees them
	return lost
}

// reportLoss logs and counts the loss of n session locks of c's backend
// pid (keys, the oldest of them taken as oldest says), records it among
// the events and as a span, linked to the span the oldest was taken in.
func (c *conn) reportLoss(pid int32, keys string, n int, oldest *heldLock, parked bool, lost, cause error, backend string) {
	c.connector.tel.lockLost(context.Background(), "advisory", n)
	c.connector.events.add(eventLockLost, lost.Error())
	heldFor := time.Since(oldest.since).Round(time.Millisecond)
	attrs := []any{"database", c.connector.pool, "connection", c.id, "backend_pid", pid,
		"keys", keys, "taken_at", oldest.site, "held_for", heldFor.String(), "parked", parked, "cause", cause.Error()}
	if backend != "" {
		attrs = append(attrs, "backend", backend)
	}
	c.connector.opts.logger.Error("lockhooks: advisory lock lost", attrs...)
	// A span of its own (issue 20: the model of holders), linked to the
	// span the lock was taken in.
	h := connHolder(c)
	h.Key, h.Site, h.Since, h.SiteKind = keys, oldest.site, oldest.since, holders.SiteTook
	c.connector.tel.lockLostSpan(h.WithSpan(oldest.span), cause)
}

// setLostLocked finishes recording the loss set in c.pin.lost: statements
// now fail with it; it returns the channel to close once the loss is
// reported, and whether c was parked. c.pin.mu is held.
func (c *conn) setLostLocked() (lostCh chan struct{}, parked bool) {
	c.pin.gen++
	if c.pin.lostCh == nil {
		c.pin.lostCh = make(chan struct{})
	}
	c.updateActiveLocked() // statements now fail with lost
	return c.pin.lostCh, c.pin.parked
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
// keys (any advisory lock, with any), and is still the backend lockhooks
// gave up on (target).
type endRequest struct {
	target endTarget
	keys   []lockKey
	any    bool
	since  time.Time
}

// endTarget names the backend an end request is for: one incarnation of a
// pid, which must have run nothing since lockhooks last talked to it.
type endTarget struct {
	pid int32
	// incarnation is the backend's, as incarnationExpr read it when the
	// connection opened ("": not known).
	incarnation string
	// quiet is the time (this process's monotonic clock) after which the
	// backend started no statement of lockhooks' connection (see
	// quietSince): a statement started after it is not lockhooks'.
	quiet time.Time
	// inFlight says that a statement was sent after quiet and never
	// answered: it may have started on the server up to sentQuiet (its
	// sending plus endSlack), so a backend that started a statement after
	// quiet is ended only while it still runs that very text (sent; ""
	// never matches).
	inFlight  bool
	sentQuiet time.Time
	sent      string
}

// incarnationExpr reads, on a connection's backend, what names that
// backend among all that had its pid: its backend_start and its server's
// start time, in microseconds since the epoch (numbers, so that no session
// setting changes their text). A pid alone does not: the server reuses
// pids, and a failover (a multi-host DSN, a moved address) reaches another
// server, whose pids collide with the first's.
const incarnationExpr = "(SELECT (extract(epoch FROM backend_start) * 1000000)::bigint::text FROM pg_stat_get_activity(pg_backend_pid())) || '@' || " + serverStartExpr

// serverStartExpr is the server's start time in incarnationExpr.
const serverStartExpr = "(extract(epoch FROM pg_postmaster_start_time()) * 1000000)::bigint::text"

// endSlack is how long after lockhooks sent a statement that was never
// answered (its connection broke) the server may still have started it:
// the time it may take to get there. A statement another client started
// on the backend within it is told from lockhooks' own by its text (see
// endTarget.inFlight).
const endSlack = 500 * time.Millisecond

// monoBase is the origin of monoNow's readings (set once, never changed).
var monoBase = time.Now()

// monoNow reads the monotonic clock, in a form an atomic holds.
func monoNow() int64 { return int64(time.Since(monoBase)) }

// noteSent records that c is sending a statement to its backend, with
// its text ("" when it need not be recognised: an end request never trusts
// an unanswered statement it cannot recognise).
func (c *conn) noteSent(text string) {
	c.sentMu.Lock()
	c.sentText = text
	c.sentMu.Unlock()
	c.sentAt.Store(monoNow())
}

// noteAnswered records that c's backend answered c.
func (c *conn) noteAnswered() { c.answeredAt.Store(monoNow()) }

// noteRoundTrip runs run, a round trip of a statement of text ("" when it
// need not be recognised), noted as the backend's last statement should
// c's connection break: sent before, and answered after unless run failed
// outside the server.
func (c *conn) noteRoundTrip(text string, run func() error) error {
	c.noteSent(text)
	err := run()
	if err == nil || isServerError(err) {
		c.noteAnswered()
	}
	return err
}

// quietSince is the time after which c's backend can have started no
// statement of c's: when its last statement was sent, plus endSlack (the
// time it may take to get there), or when it was answered if that came
// sooner, or, if it was never answered (the
// connection broke with it on the way, or waiting), when the one before it
// was answered, with the unanswered one recognised by its text within its
// slack. Never when an answer came back: on a slow link that is a round
// trip after the server finished, time in which a pooler could already
// have given the backend to another client. Statements lockhooks does not
// follow (those of a connection holding no locks, a transaction's BEGIN
// and COMMIT) are not counted: a backend whose last statement was one is
// not ended, and keeps its locks until the server notices its connection
// is gone, as before lockhooks ended any.
func (c *conn) quietSince() endTarget {
	sent, answered := c.sentAt.Load(), c.answeredAt.Load()
	t := endTarget{quiet: monoBase.Add(min(time.Duration(sent)+endSlack, time.Duration(answered)))}
	if answered < sent {
		t.quiet = monoBase.Add(time.Duration(answered))
		c.sentMu.Lock()
		text := c.sentText
		c.sentMu.Unlock()
		t.inFlight, t.sentQuiet, t.sent = true, monoBase.Add(time.Duration(sent)+endSlack), text
	}
	return t
}

// readIncarnation returns the value incarnationExpr read, or "" if it is
// not one (NULL, or not two integers), so that it is safe as a literal.
func readIncarnation(v driver.Value) string {
	s := asString(v)
	start, server, ok := strings.Cut(s, "@")
	if !ok || !integer(start) || !integer(server) {
		return ""
	}
	return s
}

// integer reports whether s is a decimal integer.
func integer(s string) bool {
	_, err := strconv.ParseInt(s, 10, 64)
	return err == nil
}

// endTarget is the end request's target for c's own backend, as of now.
func (c *conn) endTarget() endTarget {
	t := c.quietSince()
	t.pid, t.incarnation = c.pid.Load(), c.incarnation
	return t
}

// endable reports whether lockhooks may end c's backend after a loss: c
// reached the server itself and no pooler is declared or seen (see the
// rule at the top of this file).
func (c *conn) endable() bool { return c.reachesServer && !c.throughPooler() }

// throughPooler reports whether a pooler stands between c and the server:
// declared (either kind), or seen.
func (c *conn) throughPooler() bool {
	o := c.connector.opts
	return o.txPooler || o.pinningPooler || c.connector.pins.poolerSeen() != nil
}

// endPatience is how long a request waits for its backend to show one of
// its keys in pg_locks: the backend of a connection that broke while its
// lock statement was on the way may reach the lock after the monitor first
// looks. A backend that is gone, or ended, ends the request at once.
const endPatience = 10 * time.Second

func newEndQueue() *endQueue {
	return &endQueue{pending: map[int32]*endRequest{}, kick: make(chan struct{}, 1)}
}

// add asks for backend t to be ended if it holds or awaits one of keys, or,
// with any, any advisory lock. A request for another incarnation of the
// same pid replaces the older one (that backend is gone).
func (q *endQueue) add(t endTarget, keys []lockKey, any bool) {
	if t.incarnation == "" {
		return // the backend cannot be told from others with its pid
	}
	q.mu.Lock()
	r := q.pending[t.pid]
	if r == nil || r.target.incarnation != t.incarnation {
		r = &endRequest{target: t, since: time.Now()}
		q.pending[t.pid] = r
	}
	if t.quiet.After(r.target.quiet) || t.inFlight && t.sentQuiet.After(r.target.sentQuiet) {
		if t.quiet.After(r.target.quiet) {
			r.target.quiet = t.quiet
		}
		r.target.inFlight, r.target.sentQuiet, r.target.sent = t.inFlight, t.sentQuiet, t.sent
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
			if cur.target.incarnation == r.target.incarnation {
				cur.keys = append(cur.keys, r.keys...)
				cur.any = cur.any || r.any
			}
			continue // (or a newer incarnation's request replaced it)
		}
		q.pending[pid] = r
	}
}

// endBackends ends, on side, each backend that still holds or awaits one
// of the keys its lost holder held or asked for: pg_terminate_backend,
// which the server permits for the role's own backends. Only the very
// backend lockhooks gave up on is hit (see endBackend), never a pid that
// was reused, one of another server, or one a pooler gave to another
// client. A request whose backend is there but shows none of its keys is
// kept for endPatience; one the server refuses is logged and dropped; if
// the side connection fails, the rest wait for the next round.
func (p *pinning) endBackends(ctx context.Context, side driver.Conn) error {
	reqs := p.ends.take()
	defer func() {
		if len(reqs) > 0 {
			p.ends.putBack(reqs)
		}
	}()
	for pid, r := range reqs {
		alive, ended, err := endBackend(ctx, side, r)
		switch {
		case err == nil && ended:
			delete(reqs, pid)
			p.c.opts.logger.Info("lockhooks: ended the backend of a lost advisory lock holder, which still held or awaited the lock", "backend_pid", pid)
		case err == nil && (!alive || time.Since(r.since) > endPatience):
			delete(reqs, pid) // gone already, another's now, or never showed the keys
		case err == nil:
			// alive and not (yet) on the keys: look again next round
		case isServerError(err) && !dberr.ConnectionLost(err):
			delete(reqs, pid)
			p.c.opts.logger.Warn("lockhooks: cannot end the backend of a lost advisory lock holder; it keeps the lock until the server notices its connection is gone",
				"backend_pid", pid, "error", err)
		default:
			return err
		}
	}
	return nil
}

// endBackend ends r's backend if it holds or awaits one of r's keys, and
// says whether it was still there (the same incarnation, on the same
// server, having run nothing since r.target.quiet) and whether it was
// ended. Whether it ran something since is told by query_start (NULL where
// the server does not track activity: then nothing is ended), not
// state_change: a lock a backend of ours awaited when its connection
// broke, granted later, changes its state but not its query_start.
// Another client a session pooler gave the backend to, after the pooler's
// reset (DISCARD ALL) freed the lock, starts statements after it; within
// endSlack of a statement that was never answered, only the text tells
// (r.target.inFlight): the backend must still be running the very text
// that was sent.
func endBackend(ctx context.Context, side driver.Conn, r *endRequest) (alive, ended bool, err error) {
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
	p := strconv.Itoa(int(r.target.pid))
	// The quiet time as the server's clock has it: as long before the
	// statement's start as it is before now here (no clock is compared
	// with the other's).
	ago := func(t time.Time) string { return strconv.FormatInt(max(time.Since(t), 0).Microseconds(), 10) }
	q := `SELECT a.pid IS NOT NULL,
CASE WHEN a.pid IS NOT NULL AND EXISTS (SELECT 1 FROM pg_locks WHERE pid = ` + p + ` AND locktype = 'advisory'` + match + `)
THEN pg_terminate_backend(` + p + `) ELSE false END
FROM (SELECT 1) one LEFT JOIN pg_stat_activity a ON a.pid = ` + p + `
AND (extract(epoch FROM a.backend_start) * 1000000)::bigint::text || '@' || ` + serverStartExpr + ` = ` + "'" + r.target.incarnation + "'" + `
AND (coalesce(a.query_start <= statement_timestamp() - interval '` + ago(r.target.quiet) + ` microseconds', false)`
	var args []driver.NamedValue
	if r.target.inFlight {
		// pg_stat_activity keeps the first track_activity_query_size bytes
		// of a text (1 kB by default).
		q += `
	OR coalesce(a.query_start <= statement_timestamp() - interval '` + ago(r.target.sentQuiet) + ` microseconds', false)
	AND a.query <> '' AND (a.query = $1 OR (octet_length(a.query) >= 1000 AND starts_with($1, a.query)))`
		args = []driver.NamedValue{{Ordinal: 1, Value: r.target.sent}}
	}
	q += ")"
	rows, err := queryDirect(ctx, side, q, args)
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
	if k.Pair {
		return int64(uint32(int32(k.K1))), int64(uint32(int32(k.K2))), 2
	}
	return int64(uint64(k.K1) >> 32), k.K1 & 0xffffffff, 1
}
