package lockhooks

// Holders in this process, the root's part: a lock table's taker and
// owners as the model names them (the connection of an owner, for
// lockdb.DB.OwnerConn), and the timeout error that names the holder. Who
// holds what a wait waits for is the database's (internal/lockdb).

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/lockhooks/lockhooks/internal/callsite"
	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/inprocess"
	"github.com/lockhooks/lockhooks/internal/telemetry"
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

// nameHolder adds to the error of a Postgres lock wait that timed out or
// was cancelled (the context, lock_timeout, statement_timeout) what it
// waited for, how long, and who holds it: as the slow-wait log, the wait
// span's blockers read or the lookup before the context's deadline found
// it (whichever came first, with its ages now), or, for advisory keys, as
// pg_locks shows it now. It still wraps err.
func (c *conn) nameHolder(w *lockWait, err error) error {
	if w == nil || err == nil || errors.Is(err, ErrSelfWait) || errors.Is(err, ErrLockLost) {
		return err
	}
	if o := outcomeOf(err); o != telemetry.OutcomeTimeout && o != telemetry.OutcomeCanceled {
		return err
	}
	waited := time.Since(w.Started()).Round(time.Millisecond)
	text := w.HolderNamed()
	if text == "" && len(w.AdvisoryKeys()) > 0 && c.connector.opts.dialect == Postgres {
		// Nobody looked in time; the keys' holders, as pg_locks shows them
		// now (the server forgot the wait).
		ctx, cancel := context.WithTimeout(context.Background(), blockerLookupTimeout)
		b := &holders.Blockage{At: time.Now()}
		c.connector.AddBlockers(b, c.connector.KeyHolders(ctx, c, w.AdvisoryKeys()), w.AdvisoryKeys())
		cancel()
		if !b.Empty() {
			text = b.String()
		}
	}
	what := w.Kind() + " lock"
	switch {
	case w.Namespace() != "":
		what += fmt.Sprintf(" %q ids %s", w.Namespace(), w.Keys())
	case w.Keys() != "":
		what += " " + w.Keys()
	case w.Query() != "":
		what += fmt.Sprintf(" for %.120q", w.Query())
	}
	if text == "" {
		return fmt.Errorf("lockhooks: gave up waiting for the %s after %v (the holder was not looked up in time): %w", what, waited, err)
	}
	return fmt.Errorf("lockhooks: gave up waiting for the %s after %v; held by %s: %w", what, waited, text, err)
}
