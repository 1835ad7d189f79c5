package lockhooks

// Holders in this process, the root's part: a lock table's taker and
// owners as the model names them (the connection of an owner, for
// lockdb.DB.OwnerConn), and the timeout error that names the holder. Who
// holds what a wait waits for is the database's (internal/lockdb).

import (
	"context"

	"go.opentelemetry.io/otel/trace"

	"github.com/lockhooks/lockhooks/internal/callsite"
	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/inprocess"
)

// takerOf describes the caller, taking a lock for owner with ctx (run:
// RunInTx's fn whose transaction owner is, or nil): a likely self-wait
// for what it holds is one on a transaction's lock if owner is a
// transaction, else on a lock.
func takerOf(ctx context.Context, owner any, run *callsite.Run) inprocess.Taker {
	t := inprocess.Taker{Chain: chainOf(ctx, run), Span: trace.SpanContextFromContext(ctx), Hint: inprocess.HintLock}
	if _, tx := owner.(txOwner); tx {
		t.Hint = inprocess.HintTx
	}
	return t
}

// ownerHolder names a lock's owner as a holder (inprocess.Owners): its
// connection's identity, without what it holds.
func ownerHolder(owner any) holders.Holder { return connHolder(ownerConn(owner)) }

// tableHolder is the identity of a lock table's holder of key.
func tableHolder(key string, h inprocess.Holder) holders.Holder {
	return inprocess.Owners(ownerHolder).Holder(key, h, nil)
}

// explainTableWait is the caller's error of a lock table's wait for key,
// named by what (inprocess.Owners.ExplainWait).
func explainTableWait(err error, waiter, what, key string) error {
	return inprocess.Owners(ownerHolder).ExplainWait(err, waiter, what, key)
}

// needsConn reports whether a turn's owner that is not a connection waits
// for a connection of the pool: an AdvisoryLock's acquisition before it
// has one (lockdb.DB.NeedsConn).
func needsConn(owner any) bool {
	l, ok := owner.(*AdvisoryLock)
	return ok && l.needsConn.Load()
}

// ownerConn returns the connection of a lock owner.
func ownerConn(owner any) *conn {
	switch o := owner.(type) {
	case *conn:
		return o
	case txOwner:
		return o.c
	case *AdvisoryLock:
		return o.c
	}
	return nil
}
