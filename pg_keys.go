package lockhooks

import (
	"context"
	"database/sql/driver"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
	"github.com/lockhooks/lockhooks/internal/pgsession"
	"github.com/lockhooks/lockhooks/internal/sqlscan"
	"github.com/lockhooks/lockhooks/internal/stmtlocks"
)

// Advisory-lock keys: how a call's key is named and resolved from
// literals, bound arguments and expressions.

// lockKey identifies one advisory lock: an [advisorykey.Key] with the
// root's formatting (String names a bigint key where lockhooks knows the
// name it was made from) and the statements that take and release it. It
// is a defined type rather than an alias so that fmt shows a key with its
// name, as String does; converting between the two costs nothing.
type lockKey advisorykey.Key

// String formats k for a reader: a bigint key by its name too, when
// lockhooks knows it (see describeKey).
func (k lockKey) String() string { return advisorykey.Key(k).Describe(describeKey) }

// number formats k as Postgres shows it, without a name: "42" or
// "(1, 2)".
func (k lockKey) number() string { return advisorykey.Key(k).Number() }

// EvalKey resolves a call's key, asking the server to evaluate arguments
// that are expressions (stmtlocks.EvalQuery). A volatile expression may
// evaluate differently in the statement itself, so keys found this way are
// checked against pg_locks after the statement.
func (c *conn) EvalKey(ctx context.Context, call sqlscan.AdvisoryCall, args []driver.NamedValue) (lockKey, bool) {
	query, ok := stmtlocks.EvalQuery(call)
	if !ok {
		return lockKey{Shared: call.Func&sqlscan.FnShared != 0, Pair: call.NArgs == 2}, false
	}
	row, err := c.QueryRow(ctx, query+pgsession.AfterDiscard(c.pin.Discards.Load()), args)
	if err != nil {
		row = nil
	}
	k, ok := stmtlocks.EvaluatedKey(call, row)
	return lockKey(k), ok
}
