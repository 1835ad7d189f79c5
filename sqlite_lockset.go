package lockhooks

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"

	"github.com/lockhooks/lockhooks/internal/callsite"
	"github.com/lockhooks/lockhooks/internal/inprocess"
	"github.com/lockhooks/lockhooks/internal/lockset"
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
	keys, err := lockset.CanonicalIDs(ids)
	if err != nil {
		return false, err
	}
	res, err := tx.ExecContext(ctx, lockMarker, lockRequest(lockset.Encode(namespace, keys, try)))
	if err != nil {
		if strings.Contains(err.Error(), "lockhooks_lock_needs_a_lockhooks_database") {
			return false, fmt.Errorf("lockhooks: Lock needs a transaction of a database opened through lockhooks (lockhooks.Open, OpenDB or a lockhooks+ driver name); this one sent the request to the server: %w", err)
		}
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
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
	namespace, keys, try, err := lockset.Decode(raw)
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
				names[ks[i].K1] = inprocess.KeyName(namespace, lockset.DescribeID(id))
			}
			if hint, err = c.connector.stmts.SelfWaitAdvisory(ctx, c, func() string { return fmt.Sprintf("Lock(%q, %s)", namespace, lockset.DescribeIDs(keys)) }, ks, names); err != nil {
				c.connector.Events.Add(eventSelfWait, err.Error())
				return nil, err
			}
		}
		_, w := c.connector.Waits.Start(ctx, "lockset", "exclusive", "transaction",
			AttrLockNamespace.String(namespace), AttrLockKeys.String(lockset.DescribeIDs(keys)))
		w.NoteSelfHint(hint)
		var site callsite.Stack
		site.CaptureFast()
		w.SetWaiter(c, "", &site, "", ks)
		c.connector.stmts.WatchBlockers(ctx, c, w)
		ok, err = c.locksetPostgres(ctx, namespace, keys, try, &site)
		if !try {
			err = w.WithSelfHint(c.connector.stmts.NameHolder(c, w, err))
		}
		outcome := ""
		if err == nil && !ok {
			outcome = telemetry.OutcomeNotAcquired
		}
		w.End(ctx, outcome, err)
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
	table := &t.c.connector.Locksets
	owner := txOwner{t.c, t.gen}
	_, w := t.c.connector.Waits.Start(ctx, "lockset", "exclusive", "transaction",
		AttrLockNamespace.String(namespace), AttrLockKeys.String(lockset.DescribeIDs(keys)))
	var site callsite.Stack
	site.CaptureFast()
	w.SetWaiter(t.c, "", &site, "", nil)
	taken := 0
	for _, k := range keys {
		key := inprocess.LocksetKey{Namespace: namespace, ID: k}
		if w.WantsHolder() {
			if h, ok := table.Holder(key); ok && h.Owner != owner {
				w.HeldBy(tableHolder(inprocess.KeyName(namespace, lockset.DescribeID(k)), h))
			}
		}
		if try {
			if !table.TryLock(key, owner, takerOf(ctx, owner, t.run), &site) {
				t.releaseLast(taken)
				w.End(ctx, telemetry.OutcomeNotAcquired, nil)
				return false, nil
			}
		} else if err := table.Lock(ctx, key, owner, takerOf(ctx, owner, t.run), &site, w); err != nil {
			t.releaseLast(taken)
			name := inprocess.KeyName(namespace, lockset.DescribeID(k))
			err = explainTableWait(err, fmt.Sprintf("Lock(%q, %s)", namespace, lockset.DescribeIDs(keys)), "lockset id "+name, name)
			if errors.Is(err, ErrSelfWait) {
				t.c.connector.Events.Add(eventSelfWait, err.Error())
			}
			w.End(ctx, "", err)
			return false, err
		}
		t.locks = append(t.locks, key)
		taken++
	}
	w.End(ctx, telemetry.OutcomeAcquired, nil)
	t.took(&t.locksetSince)
	return true, nil
}

// releaseLast releases the last n locks the transaction took.
func (t *tx) releaseLast(n int) {
	table := &t.c.connector.Locksets
	owner := txOwner{t.c, t.gen}
	for _, key := range t.locks[len(t.locks)-n:] {
		table.Unlock(key, owner)
	}
	t.locks = t.locks[:len(t.locks)-n]
}

// locksetPostgres takes the keys as transaction-level advisory locks, in
// sorted order, in one statement (the target list runs left to right).
// TryLock of several keys tries them inside a savepoint and rolls the
// savepoint back unless it got them all (transaction-level locks taken in a
// subtransaction are released with it), so it holds all or none and never
// a session lock.
func (c *conn) locksetPostgres(ctx context.Context, namespace string, keys []string, try bool, site *callsite.Stack) (bool, error) {
	ks := lockset.AdvisoryKeys(namespace, keys, LockID)
	if !try {
		if _, err := c.QueryRow(ctx, lockset.Statement("pg_advisory_xact_lock", "count", ks), nil); err != nil {
			return false, err
		}
		c.addXact(ks, site)
		return true, nil
	}
	if len(ks) == 1 {
		row, err := c.QueryRow(ctx, "SELECT "+lockset.Calls("pg_try_advisory_xact_lock", ks), nil)
		if err != nil {
			return false, err
		}
		got, _ := row[0].(bool)
		if got {
			c.addXact(ks, site)
		}
		return got, nil
	}
	if err := c.ExecOwn(ctx, "SAVEPOINT lockhooks_trylock"); err != nil {
		return false, err
	}
	row, err := c.QueryRow(ctx, lockset.Statement("pg_try_advisory_xact_lock", "bool_and", ks), nil)
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
	if endErr := c.ExecOwn(ctx, end); endErr != nil && err == nil {
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
