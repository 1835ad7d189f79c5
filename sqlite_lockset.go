package lockhooks

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/lockhooks/lockhooks/internal/callsite"
)

// lockTable is a set of in-process exclusive locks, one per key, created
// on demand and forgotten when free (no memory for keys nobody holds).
// Waiters queue in FIFO order and are handed the lock directly, so nobody
// polls and nobody starves. A holder is identified by an owner value and
// may take a key it holds again (the count stacks).
type lockTable[K comparable] struct {
	mu      sync.Mutex
	entries map[K]*lockEntry
}

// lockEntry is one held key.
type lockEntry struct {
	owner   any
	count   int
	since   time.Time
	site    callsite.Stack    // where the holder took it
	span    trace.SpanContext // the holder's span, for waiters' links
	chain   callChain         // the holder's call chain, for self-waits
	waiters []*lockWaiter
}

// lockWaiter is one goroutine waiting for a key.
type lockWaiter struct {
	owner   any
	since   time.Time // when it began waiting
	site    callsite.Stack
	span    trace.SpanContext
	chain   callChain     // its call chain, recorded by the key when handed over
	granted chan struct{} // closed when the lock is handed to this waiter
}

// holderInfo describes who holds a key, for errors and telemetry.
type holderInfo struct {
	owner any
	since time.Time
	site  callsite.Stack
	span  trace.SpanContext
}

// lock takes key for owner (run: RunInTx's fn whose transaction owner is,
// or nil), waiting while another owner holds it, until ctx ends (then it
// returns a *tableWaitError wrapping ctx.Err() and holds nothing new). A
// wait for a holder certainly of the caller's own call chain (see
// callChain.selfWait) is refused at once with a *tableWaitError; a likely
// one waits, with the hint noted on wait (may be nil) and in the error.
func (t *lockTable[K]) lock(ctx context.Context, key K, owner any, run *fnRun, site *callsite.Stack, wait *lockWait) error {
	span := trace.SpanContextFromContext(ctx)
	chain := chainOf(ctx, run)
	t.mu.Lock()
	e := t.entry(key)
	if e.count == 0 || e.owner == owner {
		e.take(owner, site, span, chain)
		t.mu.Unlock()
		return nil
	}
	certain, likely := e.chain.selfWait(ctx)
	if certain {
		h := e.holderInfo()
		t.mu.Unlock()
		return &tableWaitError{holder: h, self: true}
	}
	hint := ""
	if likely {
		hint = selfWaitHintLock
		if _, tx := e.owner.(txOwner); tx {
			hint = selfWaitHintTx
		}
	}
	w := &lockWaiter{owner: owner, since: time.Now(), span: span, chain: chain, granted: make(chan struct{})}
	if site != nil {
		w.site = *site
	}
	e.waiters = append(e.waiters, w)
	t.mu.Unlock()
	wait.noteSelfHint(hint)

	select {
	case <-w.granted:
		return nil
	case <-ctx.Done():
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	select {
	case <-w.granted: // handed over while ctx ended: pass it on
		t.release(key, e)
	default:
		e.removeWaiter(w)
	}
	return &tableWaitError{holder: e.holderInfo(), waited: time.Since(w.since), err: ctx.Err(), hint: hint}
}

// tableWaitError is why lockTable.lock did not take a key: its context
// ended (err), or the holder is of the caller's own call chain (self). It
// carries the holder, which the caller names with the key.
type tableWaitError struct {
	holder holderInfo
	waited time.Duration
	self   bool
	err    error
	hint   string // why the wait was likely a self-wait, or ""
}

func (e *tableWaitError) Error() string {
	if e.self {
		return ErrSelfWait.Error()
	}
	return e.err.Error()
}

func (e *tableWaitError) Unwrap() error {
	if e.self {
		return ErrSelfWait
	}
	return e.err
}

// explainTableWait turns a *tableWaitError of a wait for key (named by
// what) into the caller's error: a self-wait, or how long the caller
// (waiter) waited and who holds the key, wrapping the context's error.
// Other errors are returned unchanged.
func explainTableWait(err error, waiter, what, key string) error {
	var tw *tableWaitError
	if !errors.As(err, &tw) {
		return err
	}
	h := tableHolder(key, tw.holder)
	if tw.self {
		return selfWaitError(waiter, what, h)
	}
	hint := ""
	if tw.hint != "" {
		hint = " (" + tw.hint + ")"
	}
	if h.Conn == 0 && h.Since.IsZero() { // freed meanwhile
		return fmt.Errorf("lockhooks: %s gave up waiting for %s after %v%s: %w", waiter, what, tw.waited.Round(time.Millisecond), hint, tw.err)
	}
	return fmt.Errorf("lockhooks: %s gave up waiting for %s after %v; it is held by %s%s: %w", waiter, what, tw.waited.Round(time.Millisecond), h, hint, tw.err)
}

// holderInfo describes the entry's holder; the table's mutex is held.
func (e *lockEntry) holderInfo() holderInfo {
	if e.count == 0 {
		return holderInfo{}
	}
	return holderInfo{owner: e.owner, since: e.since, site: e.site, span: e.span}
}

// tryLock takes key for owner (of run, as lock) if nobody else holds it;
// ctx is the caller's (its span for the links of later waiters, itself
// for their self-wait check).
func (t *lockTable[K]) tryLock(ctx context.Context, key K, owner any, run *fnRun, site *callsite.Stack) bool {
	chain := chainOf(ctx, run)
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entry(key)
	if e.count == 0 || e.owner == owner {
		e.take(owner, site, trace.SpanContextFromContext(ctx), chain)
		return true
	}
	return false
}

// unlock releases one hold of key by owner; it reports false if owner does
// not hold key.
func (t *lockTable[K]) unlock(key K, owner any) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.entries[key]
	if !ok || e.count == 0 || e.owner != owner {
		return false
	}
	t.release(key, e)
	return true
}

// tableEntry is a copy of one entry's owner and waiters (entriesNow).
type tableEntry[K comparable] struct {
	key     K
	owner   any
	waiters []any // their owners, in queue order
}

// entriesNow copies the held keys' owners and waiters, for a caller that
// looks at them with other locks taken (the table's mutex is a leaf).
func (t *lockTable[K]) entriesNow() []tableEntry[K] {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]tableEntry[K], 0, len(t.entries))
	for k, e := range t.entries {
		if e.count == 0 {
			continue
		}
		x := tableEntry[K]{key: k, owner: e.owner, waiters: make([]any, len(e.waiters))}
		for i, w := range e.waiters {
			x.waiters[i] = w.owner
		}
		out = append(out, x)
	}
	return out
}

// handOver gives key, held by from, to owner to, with its count; it
// reports false if from does not hold key.
func (t *lockTable[K]) handOver(key K, from, to any) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.entries[key]
	if !ok || e.count == 0 || e.owner != from {
		return false
	}
	e.owner = to
	return true
}

// holder returns who holds key, if anyone.
func (t *lockTable[K]) holder(key K) (holderInfo, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.entries[key]
	if !ok || e.count == 0 {
		return holderInfo{}, false
	}
	return holderInfo{owner: e.owner, since: e.since, site: e.site, span: e.span}, true
}

// size returns the number of keys held or waited for.
func (t *lockTable[K]) size() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.entries)
}

// entry returns key's entry, creating it; t.mu is held.
func (t *lockTable[K]) entry(key K) *lockEntry {
	if t.entries == nil {
		t.entries = make(map[K]*lockEntry)
	}
	e, ok := t.entries[key]
	if !ok {
		e = &lockEntry{}
		t.entries[key] = e
	}
	return e
}

// release drops one hold and hands the key to the first waiter when the
// count reaches zero; t.mu is held.
func (t *lockTable[K]) release(key K, e *lockEntry) {
	e.count--
	if e.count > 0 {
		return
	}
	if len(e.waiters) == 0 {
		delete(t.entries, key)
		return
	}
	w := e.waiters[0]
	e.waiters[0] = nil
	e.waiters = e.waiters[1:]
	e.take(w.owner, &w.site, w.span, w.chain)
	close(w.granted)
}

func (e *lockEntry) take(owner any, site *callsite.Stack, span trace.SpanContext, chain callChain) {
	if e.count == 0 {
		e.owner, e.since, e.span, e.chain = owner, time.Now(), span, chain
		if site != nil {
			e.site = *site
		} else {
			e.site = callsite.Stack{}
		}
	}
	e.count++
}

func (e *lockEntry) removeWaiter(w *lockWaiter) {
	for i, x := range e.waiters {
		if x == w {
			e.waiters = append(e.waiters[:i], e.waiters[i+1:]...)
			return
		}
	}
}

// ErrLockAfterSnapshot is returned by Lock and TryLock in a transaction
// whose snapshot may already hide what other transactions committed before
// the lock was granted: on SQLite, a read-only transaction that has read;
// on Postgres, a REPEATABLE READ or SERIALIZABLE transaction. Lock first,
// or commit and lock at the start of a new transaction.
var ErrLockAfterSnapshot = errors.New("lockhooks: lock taken after the transaction's snapshot")

// ErrWriterLockTimeout is returned when a write on SQLite waited for the
// in-process writer lock longer than the busy timeout.
var ErrWriterLockTimeout = errors.New("lockhooks: timed out waiting for the SQLite writer lock")

// lockMarker is the statement Lock runs through tx.ExecContext. A lockhooks
// connection recognises it and never sends it; any other driver sends it
// and fails on the unknown function, so a transaction that is not
// lockhooks' never silently goes unlocked.
const lockMarker = "SELECT lockhooks_lock_needs_a_lockhooks_database($1)"

// lockRequest is Lock's argument: the canonical request, encoded. It is a
// driver.Valuer so that drivers without a NamedValueChecker (modernc) pass
// its bytes through unchanged.
type lockRequest []byte

// Value returns the encoded request.
func (r lockRequest) Value() (driver.Value, error) { return []byte(r), nil }

// Lock takes the in-memory locks (namespace, id) for every id, in one
// canonical order (integers numerically, then strings and fmt.Stringers
// bytewise, then 16-byte UUIDs), waiting without polling while another
// transaction holds one, until ctx ends. The locks are released only after
// the transaction's COMMIT or ROLLBACK returned. A transaction may lock an
// id it holds again.
//
// On SQLite the locks are in-process; on Postgres they are
// pg_advisory_xact_lock keys derived from (namespace, id), taken in sorted
// key order in one round trip, so the same code serves several replicas.
// tx must come from a database opened through lockhooks.
func Lock(ctx context.Context, tx *sql.Tx, namespace string, ids ...any) error {
	_, err := lockRequestExec(ctx, tx, namespace, ids, false)
	return err
}

// TryLock takes all the locks of Lock, or none, without waiting; it reports
// whether it took them. Use it to skip work another transaction holds (the
// queue-worker pattern).
func TryLock(ctx context.Context, tx *sql.Tx, namespace string, ids ...any) (bool, error) {
	return lockRequestExec(ctx, tx, namespace, ids, true)
}

func lockRequestExec(ctx context.Context, tx *sql.Tx, namespace string, ids []any, try bool) (bool, error) {
	if tx == nil {
		return false, errors.New("lockhooks: Lock needs a transaction (db.BeginTx); got a nil *sql.Tx")
	}
	keys, err := canonicalIDs(ids)
	if err != nil {
		return false, err
	}
	res, err := tx.ExecContext(ctx, lockMarker, encodeLockRequest(namespace, keys, try))
	if err != nil {
		if strings.Contains(err.Error(), "lockhooks_lock_needs_a_lockhooks_database") {
			return false, fmt.Errorf("lockhooks: Lock needs a transaction of a database opened through lockhooks (lockhooks.Open, OpenDB or a lockhooks+ driver name); this one sent the request to the server: %w", err)
		}
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

// Type tags of canonical ids; their order is the order between types.
const (
	tagInt    = 'i'
	tagString = 's'
	tagUUID   = 'u'
)

// canonicalIDs encodes ids so that byte order is the documented lock
// order, sorts them and drops duplicates.
func canonicalIDs(ids []any) ([]string, error) {
	if len(ids) == 0 {
		return nil, errors.New("lockhooks: Lock needs at least one id")
	}
	keys := make([]string, 0, len(ids))
	for _, id := range ids {
		var b []byte
		if n, isInt, fits := integerValue(id); isInt {
			if !fits {
				return nil, fmt.Errorf("lockhooks: id %d does not fit an int64", id)
			}
			keys = append(keys, string(intKey(n)))
			continue
		}
		switch v := id.(type) {
		case string:
			b = append([]byte{tagString}, v...)
		case [16]byte:
			b = append([]byte{tagUUID}, v[:]...)
		case fmt.Stringer:
			b = append([]byte{tagString}, v.String()...)
		default:
			return nil, fmt.Errorf("lockhooks: cannot lock an id of type %T; use an integer, a string, a [16]byte UUID or a fmt.Stringer", id)
		}
		keys = append(keys, string(b))
	}
	slices.Sort(keys)
	return slices.Compact(keys), nil
}

// intKey encodes n so that byte order is numeric order.
func intKey(n int64) []byte {
	b := make([]byte, 9)
	b[0] = tagInt
	binary.BigEndian.PutUint64(b[1:], uint64(n)^(1<<63))
	return b
}

// describeID turns a canonical id back into text for messages.
func describeID(key string) string {
	switch key[0] {
	case tagInt:
		return strconv.FormatInt(int64(binary.BigEndian.Uint64([]byte(key[1:]))^(1<<63)), 10)
	case tagUUID:
		return fmt.Sprintf("%x", key[1:])
	}
	return strconv.Quote(key[1:])
}

// encodeLockRequest packs a request: try flag, namespace, then ids, each
// length-prefixed.
func encodeLockRequest(namespace string, keys []string, try bool) lockRequest {
	b := []byte{0}
	if try {
		b[0] = 1
	}
	b = binary.AppendUvarint(b, uint64(len(namespace)))
	b = append(b, namespace...)
	for _, k := range keys {
		b = binary.AppendUvarint(b, uint64(len(k)))
		b = append(b, k...)
	}
	return b
}

// decodeLockRequest unpacks encodeLockRequest.
func decodeLockRequest(b []byte) (namespace string, keys []string, try bool, err error) {
	bad := errors.New("lockhooks: malformed lock request")
	if len(b) < 1 {
		return "", nil, false, bad
	}
	try, b = b[0] == 1, b[1:]
	next := func() (string, bool) {
		n, w := binary.Uvarint(b)
		if w <= 0 || uint64(len(b)-w) < n {
			return "", false
		}
		s := string(b[w : w+int(n)])
		b = b[w+int(n):]
		return s, true
	}
	var ok bool
	if namespace, ok = next(); !ok {
		return "", nil, false, bad
	}
	for len(b) > 0 {
		k, ok := next()
		if !ok || k == "" {
			return "", nil, false, bad
		}
		keys = append(keys, k)
	}
	return namespace, keys, try, nil
}

// locksetKey is one in-memory lock.
type locksetKey struct {
	namespace string
	id        string // canonical
}

// txOwner identifies one transaction as a lock owner: database/sql reuses
// a connection's tx wrapper, so the generation tells transactions apart.
type txOwner struct {
	c   *conn
	gen uint64
}

// lockset serves Lock's marker statement on conn c, in its transaction.
func (c *conn) lockset(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	if len(args) != 1 {
		return nil, errors.New("lockhooks: malformed lock request")
	}
	var raw []byte
	switch v := args[0].Value.(type) {
	case lockRequest:
		raw = v
	case []byte:
		raw = v
	default:
		return nil, fmt.Errorf("lockhooks: malformed lock request (%T)", v)
	}
	namespace, keys, try, err := decodeLockRequest(raw)
	if err != nil {
		return nil, err
	}
	t := &c.tx
	if t.inner == nil {
		return nil, errors.New("lockhooks: Lock needs a transaction: pass the *sql.Tx of db.BeginTx")
	}
	if err := t.snapshotGuard(namespace); err != nil {
		return nil, err
	}
	var ok bool
	if c.connector.opts.dialect == Postgres {
		ks := make([]lockKey, len(keys))
		for i, id := range keys {
			ks[i] = lockKey{k1: LockID(namespace + "\x00" + id)}
		}
		hint := ""
		if !try {
			names := map[int64]string{}
			for i, id := range keys {
				names[ks[i].k1] = lockKeyName(namespace, describeID(id))
			}
			if hint, err = c.selfWaitAdvisory(ctx, func() string { return fmt.Sprintf("Lock(%q, %s)", namespace, describeIDs(keys)) }, ks, names); err != nil {
				c.connector.events.add(eventSelfWait, err.Error())
				return nil, err
			}
		}
		_, w := c.connector.tel.startWait(ctx, "lockset", "exclusive", "transaction",
			AttrLockNamespace.String(namespace), AttrLockKeys.String(describeIDs(keys)))
		w.noteSelfHint(hint)
		var site callsite.Stack
		site.CaptureFast()
		w.setWaiter(c, "", &site, "", ks)
		c.watchBlockers(ctx, w)
		ok, err = c.locksetPostgres(ctx, namespace, keys, try, &site)
		if !try {
			err = w.withSelfHint(c.nameHolder(w, err))
		}
		outcome := ""
		if err == nil && !ok {
			outcome = outcomeNotAcquired
		}
		w.end(ctx, outcome, err)
		if ok {
			t.took(&t.locksetSince)
		}
	} else {
		ok, err = t.locksetInProcess(ctx, namespace, keys, try)
	}
	if err != nil || !ok {
		return driver.RowsAffected(0), err
	}
	c.noteLockset(namespace, keys)
	return driver.RowsAffected(1), nil
}

// snapshotGuard refuses a lock the transaction's snapshot would undermine.
func (t *tx) snapshotGuard(namespace string) error {
	if t.c.connector.opts.dialect == Postgres {
		switch sql.IsolationLevel(t.opts.Isolation) {
		case sql.LevelRepeatableRead, sql.LevelSnapshot, sql.LevelSerializable, sql.LevelLinearizable:
			return fmt.Errorf("%w: Lock(%q) in a %v transaction: Postgres fixes its snapshot at the start of the statement that waits for the lock, so rows committed by the holder stay invisible; lock in a READ COMMITTED transaction (the default), or commit and lock before the snapshot-isolated work",
				ErrLockAfterSnapshot, namespace, sql.IsolationLevel(t.opts.Isolation))
		}
		return nil
	}
	if t.readOnly() && t.read {
		return fmt.Errorf("%w: Lock(%q) after this read-only SQLite transaction has read: its snapshot hides what the lock's previous holder committed; lock before the first read, or commit and start a new transaction after locking",
			ErrLockAfterSnapshot, namespace)
	}
	return nil
}

// locksetInProcess takes keys in order in the database's lockset table,
// timed as one lock wait linked to the holders it waits for.
func (t *tx) locksetInProcess(ctx context.Context, namespace string, keys []string, try bool) (bool, error) {
	table := &t.c.connector.locksets
	owner := txOwner{t.c, t.gen}
	_, w := t.c.connector.tel.startWait(ctx, "lockset", "exclusive", "transaction",
		AttrLockNamespace.String(namespace), AttrLockKeys.String(describeIDs(keys)))
	var site callsite.Stack
	site.CaptureFast()
	w.setWaiter(t.c, "", &site, "", nil)
	taken := 0
	for _, k := range keys {
		key := locksetKey{namespace, k}
		if w.wantsHolder() {
			if h, ok := table.holder(key); ok && h.owner != owner {
				w.heldBy(tableHolder(lockKeyName(namespace, describeID(k)), h))
			}
		}
		if try {
			if !table.tryLock(ctx, key, owner, t.run, &site) {
				t.releaseLast(taken)
				w.end(ctx, outcomeNotAcquired, nil)
				return false, nil
			}
		} else if err := table.lock(ctx, key, owner, t.run, &site, w); err != nil {
			t.releaseLast(taken)
			name := lockKeyName(namespace, describeID(k))
			err = explainTableWait(err, fmt.Sprintf("Lock(%q, %s)", namespace, describeIDs(keys)), "lockset id "+name, name)
			if errors.Is(err, ErrSelfWait) {
				t.c.connector.events.add(eventSelfWait, err.Error())
			}
			w.end(ctx, "", err)
			return false, err
		}
		t.locks = append(t.locks, key)
		taken++
	}
	w.end(ctx, outcomeAcquired, nil)
	t.took(&t.locksetSince)
	return true, nil
}

// describeIDs lists canonical ids as text.
func describeIDs(keys []string) string {
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = describeID(k)
	}
	return strings.Join(parts, ", ")
}

// releaseLast releases the last n locks the transaction took.
func (t *tx) releaseLast(n int) {
	table := &t.c.connector.locksets
	owner := txOwner{t.c, t.gen}
	for _, key := range t.locks[len(t.locks)-n:] {
		table.unlock(key, owner)
	}
	t.locks = t.locks[:len(t.locks)-n]
}

// advisoryKeys maps (namespace, id) to Postgres advisory keys, sorted,
// and remembers what each was made from (see describeKey).
func advisoryKeys(namespace string, keys []string) []int64 {
	out := make([]int64, len(keys))
	for i, k := range keys {
		out[i] = LockID(namespace + "\x00" + k)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// locksetPostgres takes the keys as transaction-level advisory locks, in
// sorted order, in one statement (the target list runs left to right).
// TryLock of several keys tries them inside a savepoint and rolls the
// savepoint back unless it got them all (transaction-level locks taken in a
// subtransaction are released with it), so it holds all or none and never
// a session lock.
func (c *conn) locksetPostgres(ctx context.Context, namespace string, keys []string, try bool, site *callsite.Stack) (bool, error) {
	ks := advisoryKeys(namespace, keys)
	if !try {
		if _, err := c.queryRow(ctx, lockAll("pg_advisory_xact_lock", "count", ks), nil); err != nil {
			return false, err
		}
		c.addXact(ks, site)
		return true, nil
	}
	if len(ks) == 1 {
		row, err := c.queryRow(ctx, "SELECT "+calls("pg_try_advisory_xact_lock", ks), nil)
		if err != nil {
			return false, err
		}
		got, _ := row[0].(bool)
		if got {
			c.addXact(ks, site)
		}
		return got, nil
	}
	if err := c.execOwn(ctx, "SAVEPOINT lockhooks_trylock"); err != nil {
		return false, err
	}
	row, err := c.queryRow(ctx, lockAll("pg_try_advisory_xact_lock", "bool_and", ks), nil)
	all := err == nil
	for _, v := range row {
		if ok, _ := v.(bool); !ok {
			all = false
		}
	}
	end := "ROLLBACK TO SAVEPOINT lockhooks_trylock"
	if all {
		end = "RELEASE SAVEPOINT lockhooks_trylock"
	}
	if endErr := c.execOwn(ctx, end); endErr != nil && err == nil {
		err = endErr
	}
	if err != nil {
		return false, err
	}
	if all {
		c.addXact(ks, site)
	}
	return all, nil
}

// maxTargetCalls bounds the calls lockAll writes as a target list: Postgres
// refuses a target list of more than 1664 entries (54011).
const maxTargetCalls = 1000

// lockAll returns the statement that calls fn on each key, in order: a
// target list "SELECT fn(k1), fn(k2), …" (one column per key), or, for more
// keys than a target list may have, "SELECT agg(fn(k)) FROM unnest(…) k"
// (one column; unnest yields the keys in order, and the aggregate's
// argument is evaluated row by row as they come, so the locks are taken in
// the same order).
func lockAll(fn, agg string, keys []int64) string {
	if len(keys) <= maxTargetCalls {
		return "SELECT " + calls(fn, keys)
	}
	var b strings.Builder
	b.WriteString("SELECT " + agg + "(" + fn + "(k)) FROM unnest('{")
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(k, 10))
	}
	b.WriteString("}'::bigint[]) AS k")
	return b.String()
}

// calls returns "fn(k1), fn(k2), …".
func calls(fn string, keys []int64) string {
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fn + "(" + strconv.FormatInt(k, 10) + ")"
	}
	return strings.Join(parts, ", ")
}

// writerLock is the in-process lock that serialises SQLite writers of one
// database: FIFO, honouring ctx, bounded by the busy timeout. Taking it
// uncontended allocates nothing.
//
// Waiters are told who holds it: the autocommit statement, or where the
// holding transaction began. Finding that call site is a stack walk of
// a microsecond or two, a fifth of an in-memory write transaction, for a
// message that prints only when writers wait for each other, so a
// transaction that takes the lock uncontended records its site only while
// writers have waited within the last siteWindow. A writer that then
// waits for a transaction whose site was not recorded asks for it, and
// the holder records the site of its next statement (see
// noteStatementInTx).
type writerLock struct {
	mu       sync.Mutex
	held     bool
	owner    any
	since    time.Time
	stmt     string            // the autocommit statement holding it, or
	site     callsite.Stack    // where the transaction holding it began (empty: not recorded)
	siteLate bool              // site is that of a later statement of the transaction
	span     trace.SpanContext // the holder's span
	chain    callChain         // the holder's call chain (its BeginTx's, or its statement's), for self-waits
	waiters  []*writerWaiter

	// contended is when a writer last had to wait.
	contended time.Time
	// siteWanted asks the holding transaction for its call site.
	siteWanted atomic.Bool
}

// siteWindow is how long after writers last waited for each other an
// uncontended transaction still records where it began.
const siteWindow = time.Minute

type writerWaiter struct {
	owner   any
	since   time.Time // when it began waiting
	granted chan struct{}
	stmt    string
	site    callsite.Stack
	span    trace.SpanContext
	chain   callChain
}

// lock takes the writer lock for owner, waiting at most timeout (0: no
// limit beyond ctx). stmt is the autocommit statement that takes it, or ""
// for a transaction (begun with ctx, RunInTx's when it began it), whose
// call site is recorded (see writerLock).
func (w *writerLock) lock(ctx context.Context, tel *telemetry, owner any, timeout time.Duration, stmt string) (err error) {
	span := trace.SpanContextFromContext(ctx)
	chain := chainOf(ctx, runOf(ctx))
	w.mu.Lock()
	now := time.Now()
	if !w.held {
		w.held, w.owner, w.since, w.stmt, w.span, w.chain = true, owner, now, stmt, span, chain
		w.site.Reset()
		w.siteLate = false
		if stmt == "" && (callsite.FastCapture || now.Sub(w.contended) < siteWindow) {
			w.site.CaptureFast()
		}
		w.mu.Unlock()
		return nil
	}
	certain, likely := w.chain.selfWait(ctx)
	if certain {
		// The holder is the transaction of RunInTx's fn, which runs on
		// this goroutine: it cannot end while we wait.
		holder := w.holderLocked()
		w.mu.Unlock()
		waiter := "BeginTx of a write transaction"
		if stmt != "" {
			waiter = fmt.Sprintf("the statement %.120q", stmt)
		}
		err := selfWaitError(waiter, "the SQLite writer lock", holder.identity())
		tel.events.add(eventSelfWait, err.Error())
		return err
	}
	hint := ""
	if likely {
		hint = selfWaitHintTx
		if w.stmt != "" {
			hint = selfWaitHintStmt
		}
	}
	wt := &writerWaiter{owner: owner, since: now, granted: make(chan struct{}), stmt: stmt, span: span, chain: chain}
	if stmt == "" {
		wt.site.CaptureFast()
	}
	w.waiters = append(w.waiters, wt)
	w.contended = now
	if w.stmt == "" && !w.site.Recorded() {
		w.siteWanted.Store(true)
	}
	holder := w.holderLocked()
	w.mu.Unlock()

	// Contended: time the wait, linked to the holder.
	_, wait := tel.startWait(ctx, "sqlite_writer", "exclusive", "transaction")
	wait.setWaiter(ownerConn(owner), "", &wt.site, stmt, nil)
	wait.noteSelfHint(hint)
	if wait.wantsHolder() {
		wait.heldBy(holder.identity())
	}
	defer func() { wait.end(ctx, "", err) }()

	var expired <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		expired = t.C
	}
	select {
	case <-wt.granted:
		return nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-expired:
	}
	w.mu.Lock()
	select {
	case <-wt.granted: // handed over meanwhile: keep it
		w.mu.Unlock()
		return nil
	default:
	}
	for i, x := range w.waiters {
		if x == wt {
			w.waiters = append(w.waiters[:i], w.waiters[i+1:]...)
			break
		}
	}
	holder = w.holderLocked()
	w.mu.Unlock()
	if hint != "" {
		hint = " (" + hint + ")"
	}
	if err != nil {
		// Cancelled or past its deadline: say what it waited for, how long,
		// and who holds it, still wrapping the context's error.
		return fmt.Errorf("lockhooks: gave up waiting for the SQLite writer lock after %v; held by %s%s: %w",
			time.Since(now).Round(time.Millisecond), holder.describe(), hint, err)
	}
	err = fmt.Errorf("%w: waited %v; held by %s%s; shorten write transactions or raise the busy timeout (lockhooks.WithBusyTimeout)",
		ErrWriterLockTimeout, timeout, holder.describe(), hint)
	tel.events.add(eventWriterTimeout, err.Error())
	return err
}

// holderLocked returns the holder, to describe once w.mu is released.
func (w *writerLock) holderLocked() writerHolder {
	return writerHolder{owner: w.owner, since: w.since, stmt: w.stmt, site: w.site, siteLate: w.siteLate, span: w.span}
}

// noteStatementInTx is called at each statement of the transaction that
// holds the writer lock: if a waiter asked where that transaction is, it
// records the statement's call site. Otherwise it costs one atomic load.
func (w *writerLock) noteStatementInTx(owner any) {
	if !w.siteWanted.Load() {
		return
	}
	var site callsite.Stack
	site.Capture()
	w.mu.Lock()
	if w.held && w.owner == owner && w.stmt == "" && !w.site.Recorded() {
		w.site, w.siteLate = site, true
		w.siteWanted.Store(false)
	}
	w.mu.Unlock()
}

// unlock releases the writer lock, handing it to the first waiter.
func (w *writerLock) unlock() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.handOff()
}

// handOff gives the lock to the first waiter, or frees it; w.mu is held.
// A waiter recorded its own call site when it began waiting.
func (w *writerLock) handOff() {
	w.siteWanted.Store(false)
	w.siteLate = false
	if len(w.waiters) == 0 {
		w.held, w.owner, w.stmt, w.chain = false, nil, "", callChain{}
		w.site.Reset()
		return
	}
	next := w.waiters[0]
	w.waiters[0] = nil
	w.waiters = w.waiters[1:]
	w.owner, w.since, w.stmt, w.site, w.span, w.chain = next.owner, time.Now(), next.stmt, next.site, next.span, next.chain
	close(next.granted)
}
