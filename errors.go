package lockhooks

import (
	"errors"
	"fmt"
	"strings"

	"github.com/lockhooks/lockhooks/internal/dberr"
	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/retry"
)

// IsDeadlock reports whether err, or an error it wraps, is Postgres's
// deadlock_detected (SQLSTATE 40P01): the server aborted this transaction
// to break a cycle of lock waits. Retry the whole transaction ([RunInTx]
// does); to stop it happening, take locks in one global order (see
// [WithLockOrderCheck]). It works with pgx, lib/pq and any driver whose
// errors have a SQLState() string method.
func IsDeadlock(err error) bool { return dberr.SQLState(err) == dberr.Deadlock }

// IsSerializationFailure reports whether err, or an error it wraps, says
// the transaction's snapshot conflicts with a concurrent commit: Postgres's
// serialization_failure (SQLSTATE 40001, REPEATABLE READ and SERIALIZABLE
// transactions), or SQLite's SQLITE_BUSY_SNAPSHOT (a WAL transaction that
// read an older snapshot tried to write). Retry the whole transaction.
func IsSerializationFailure(err error) bool {
	if dberr.SQLState(err) == dberr.SerializationFailure {
		return true
	}
	code, ok := dberr.SQLiteCode(err)
	return ok && code == dberr.SQLiteBusySnapshot
}

// IsLockNotAvailable reports whether err, or an error it wraps, says a lock
// could not be had in the time allowed: Postgres's lock_not_available
// (SQLSTATE 55P03, from lock_timeout or NOWAIT), SQLite's SQLITE_BUSY
// (other than SQLITE_BUSY_SNAPSHOT) or SQLITE_LOCKED after the busy
// timeout, or lockhooks' [ErrWriterLockTimeout]. Such a wait limit is
// usually deliberate, so [RunInTx] retries 55P03 only when asked
// ([RetryLockNotAvailable]).
func IsLockNotAvailable(err error) bool {
	if dberr.SQLState(err) == dberr.LockNotAvailable || errors.Is(err, ErrWriterLockTimeout) {
		return true
	}
	code, ok := dberr.SQLiteCode(err)
	return ok && code != dberr.SQLiteBusySnapshot && (code&0xff == dberr.SQLiteBusy || code&0xff == dberr.SQLiteLocked)
}

// IsRetryable reports whether running the whole transaction again may
// succeed where this attempt failed: a deadlock (40P01), a serialization
// failure (40001), or SQLite's SQLITE_BUSY (any extended code, including
// SQLITE_BUSY_SNAPSHOT) or SQLITE_LOCKED, or lockhooks'
// [ErrWriterLockTimeout]. Postgres's lock_not_available (55P03) is not
// retryable by this definition: lock_timeout and NOWAIT are usually asked
// for on purpose.
func IsRetryable(err error) bool {
	return retry.Transient(err) || errors.Is(err, ErrWriterLockTimeout)
}

// DeadlockError is the error a statement run through lockhooks returns
// when Postgres aborted its transaction as a deadlock victim (SQLSTATE
// 40P01). Beside Postgres's message and DETAIL (which names the backends
// and the lock each waited for) it says, per side of the cycle, who it is
// (a connection of a lockhooks database of this process, with the call
// site where its transaction began, or a backend outside the process), how
// long its transaction had run, its statement, what it held and what it
// waited for, and what to change for the pattern (rows or keys taken in
// opposite orders, or a parent row kept FOR UPDATE against a foreign-key
// check). It names the locks lockhooks saw this transaction take: lockset
// ids ([Lock]), advisory keys, and tables locked with FOR UPDATE or FOR NO
// KEY UPDATE (row locks of plain UPDATE and DELETE statements are not
// tracked). It wraps the driver's error, so [IsDeadlock] and errors.As on
// the driver's type still work.
type DeadlockError struct {
	Err     error          // the driver's error
	Detail  string         // Postgres's DETAIL, when the driver's error carries one
	Held    []string       // the locks the transaction held, in the order it took them
	Waiting []string       // the locks the failing statement asked for
	Sides   []DeadlockSide // the backends of the cycle, in the DETAIL's order
	Advice  string         // what to change, for the deadlock's pattern
	Note    string         // what could not be read about the other sides

	others []holders.Holder // the other sides that are connections of this process
}

// Error is the driver's message, Postgres's DETAIL, each side of the cycle
// and the advice.
func (e *DeadlockError) Error() string {
	var b strings.Builder
	b.WriteString(e.Err.Error())
	if e.Detail != "" && !strings.Contains(b.String(), e.Detail) {
		b.WriteString("; DETAIL: ")
		b.WriteString(strings.TrimSuffix(strings.ReplaceAll(e.Detail, "\n", " "), "."))
	}
	b.WriteString("; lockhooks: ")
	if len(e.Sides) == 0 {
		b.WriteString("this transaction held ")
		if len(e.Held) == 0 {
			b.WriteString("no lock lockhooks tracks (Lock, advisory locks, FOR [NO KEY] UPDATE; UPDATE and DELETE row locks are not tracked)")
		} else {
			b.WriteString(strings.Join(e.Held, ", "))
		}
		if len(e.Waiting) > 0 {
			b.WriteString(" and was waiting for ")
			b.WriteString(strings.Join(e.Waiting, ", "))
		}
	}
	for i, s := range e.Sides {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(s.String())
	}
	if e.Note != "" {
		b.WriteString(" (" + e.Note + ")")
	}
	b.WriteString("; ")
	if e.Advice != "" {
		b.WriteString(e.Advice)
	} else {
		b.WriteString("retry the transaction (lockhooks.RunInTx does) and take these locks in one order everywhere (lockhooks.WithLockOrderCheck finds where they are not)")
	}
	return b.String()
}

// String describes one side: "this transaction (connection #1 of … ,
// in a transaction begun at x.go:10) ran 1.2s, held …, waited for … in
// "UPDATE …"".
func (s DeadlockSide) String() string {
	var b strings.Builder
	if s.This {
		b.WriteString("this transaction, on ")
	} else {
		fmt.Fprintf(&b, "the other side, ")
	}
	b.WriteString(s.Who)
	if s.Ran > 0 {
		fmt.Fprintf(&b, ", had run %v", s.Ran)
	}
	if len(s.Held) > 0 {
		b.WriteString(", held " + strings.Join(s.Held, ", "))
	}
	if s.WaitedFor != "" {
		b.WriteString(", waited for " + s.WaitedFor)
	}
	if s.Statement != "" {
		fmt.Fprintf(&b, " in %.200q", s.Statement)
	}
	return b.String()
}

// Unwrap returns the driver's error.
func (e *DeadlockError) Unwrap() error { return e.Err }

// deadlockError explains a deadlock victim's error (see DeadlockError and
// deadlock.go), and puts its whole text among the database's events; other
// errors are returned unchanged. Reading the other sides takes a side
// connection: a deadlock already cost deadlock_timeout (1s by default).
func (c *conn) deadlockError(err error) error {
	if dberr.SQLState(err) != dberr.Deadlock {
		return err
	}
	var de *DeadlockError
	if errors.As(err, &de) {
		return err
	}
	held, waiting := c.tx.held.Describe(describeKey)
	held = append(held, c.order.Describe(describeKey)...) // known only with the lock-order checker on
	de = &DeadlockError{Err: err, Detail: dberr.Detail(err), Held: held, Waiting: waiting}
	c.explainDeadlock(de, dberr.Where(err))
	c.connector.Events.Add(eventDeadlock, de.Error())
	args := []any{"database", c.connector.Pool, "connection", c.id, "backend_pid", c.pin.PID.Load()}
	for _, s := range de.Sides {
		if s.This {
			args = append(args, "waited_for", s.WaitedFor)
		}
	}
	for _, s := range de.Sides {
		if !s.This {
			args = append(args, "holder", s.Who, "holder_pid", s.PID, "holder_site", s.Site, "holder_ran", s.Ran.String())
			break
		}
	}
	c.connector.opts.logger.Warn("lockhooks: deadlock: Postgres aborted this transaction", append(args, "error", de.Error())...)
	return de
}
