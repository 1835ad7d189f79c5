package lockhooks

import (
	"context"
	"database/sql/driver"
	"fmt"
	"strconv"
)

// RunInTx's commit path on Postgres: what it must know to resolve a COMMIT
// whose reply was cut off, learnt without a round trip of its own.
//
// A COMMIT cut off in flight can be resolved only through the transaction's
// id (pg_xact_status), and the id must be known before COMMIT is sent: its
// reply is what gets lost. Reading it just before COMMIT costs a round trip
// per attempt, and finds none in a transaction whose only effect is a
// NOTIFY (Postgres assigns that one its id inside COMMIT). So lockhooks
// assigns every attempt its id at BEGIN, in the same round trip: it sends
// the BEGIN itself, in one simple-protocol message with a query of the id.
// A transaction that writes nothing then has an id as well: its COMMIT writes a commit record,
// without waiting for the disk (Postgres commits asynchronously a
// transaction that wrote no WAL before COMMIT), and uses up one transaction
// id. On a standby, where nothing can be written or notified, no id is
// assigned (pg_is_in_recovery()). A transaction that a failed statement
// aborted must not be answered COMMIT's silent ROLLBACK: through pgx,
// lockhooks asks the connection's transaction status (PgConn.TxStatus,
// from the server's last ReadyForQuery, so no round trip) and rolls back
// instead of committing; through other drivers COMMIT is sent as
// "SELECT 1; COMMIT", which fails at the SELECT (25P02).
//
// lockhooks' BEGIN message and COMMIT are pg_begin.go's, which composes
// the id query with what else the transaction says at BEGIN (its identity)
// and says which drivers and isolation levels allow it. Other
// transactions read the id before COMMIT instead, in a round trip of their
// own (RunInTx's fallback).

// commitInfo is what RunInTx learns about an attempt's transaction; the
// wrapped connection fills it in when it begins the transaction itself.
type commitInfo struct {
	begun bool   // lockhooks sent BEGIN, with the id query
	xid   string // the transaction id; "" on a standby (nothing can be written there)
}

// commitInfoKey carries RunInTx's *commitInfo in BeginTx's context.
type commitInfoKey struct{}

// runInTxContext is the context RunInTx begins its transactions with: the
// caller's, which fn's statements run with, carrying the attempt's
// *commitInfo (nil: no commit check) and RunInTx's fn, which the
// transaction records as its call chain (selfwait.go): a wait of fn on
// this transaction is a self-wait (ErrSelfWait). RunInTx passes a pointer
// to the one in its runner.
type runInTxContext struct {
	context.Context
	info *commitInfo
	run  *fnRun
}

// Value returns the *commitInfo for commitInfoKey.
func (c *runInTxContext) Value(key any) any {
	if _, ok := key.(commitInfoKey); ok {
		if c.info == nil {
			return nil
		}
		return c.info
	}
	return c.Context.Value(key)
}

// xidQuery assigns the transaction its id (none on a standby).
const xidQuery = "SELECT (CASE WHEN pg_is_in_recovery() THEN NULL ELSE pg_current_xact_id() END)::text"

// textOf returns a text column's value as a string ("" for NULL).
func textOf(v driver.Value) string {
	switch v := v.(type) {
	case string:
		return v
	case []byte:
		return string(v)
	case nil:
		return ""
	case int64:
		return strconv.FormatInt(v, 10)
	}
	return fmt.Sprint(v)
}
