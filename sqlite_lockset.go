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

	"github.com/lockhooks/lockhooks/internal/callsite"
	"github.com/lockhooks/lockhooks/internal/telemetry"
)

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
			ks[i] = lockKey{K1: LockID(namespace + "\x00" + id)}
		}
		hint := ""
		if !try {
			names := map[int64]string{}
			for i, id := range keys {
				names[ks[i].K1] = lockKeyName(namespace, describeID(id))
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
			outcome = telemetry.OutcomeNotAcquired
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
				w.end(ctx, telemetry.OutcomeNotAcquired, nil)
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
	w.end(ctx, telemetry.OutcomeAcquired, nil)
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
