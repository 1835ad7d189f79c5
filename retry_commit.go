package lockhooks

import (
	"context"

	"github.com/lockhooks/lockhooks/internal/callsite"
	"github.com/lockhooks/lockhooks/internal/retry"
)

// RunInTx's commit path on Postgres learns the transaction id of each
// attempt at BEGIN (internal/retry says why and how a COMMIT cut off in
// flight is resolved with it): lockhooks' BEGIN message and COMMIT are
// internal/pgbegin's, which composes the id query with what else the
// transaction says at BEGIN (its identity) and says which drivers and
// isolation levels allow it. Other transactions read the id before COMMIT
// instead, in a round trip of their own (RunInTx's fallback).

// runInTxContext is the context RunInTx begins its transactions with: the
// caller's, which fn's statements run with, carrying the attempt's
// *retry.CommitInfo (nil: no commit check) and RunInTx's fn, which the
// transaction records as its call chain (selfwait.go): a wait of fn on
// this transaction is a self-wait (ErrSelfWait). RunInTx passes a pointer
// to the one in its runner.
type runInTxContext struct {
	context.Context
	info *retry.CommitInfo
	run  *callsite.Run
}

// Value returns the *retry.CommitInfo for retry.InfoKey.
func (c *runInTxContext) Value(key any) any {
	if _, ok := key.(retry.InfoKey); ok {
		if c.info == nil {
			return nil
		}
		return c.info
	}
	return c.Context.Value(key)
}
