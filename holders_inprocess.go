package lockhooks

// Holders in this process, the root's part: who holds what a wait waits
// for, from the lock tables (internal/inprocess) and the connections'
// session locks (internal/holding), and on Postgres from the server
// (internal/pgblocking); a lock table's taker and owners as the model
// names them; and the timeout error that names the holder.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/lockhooks/lockhooks/internal/callsite"
	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/holding"
	"github.com/lockhooks/lockhooks/internal/inprocess"
	"github.com/lockhooks/lockhooks/internal/telemetry"
)

// holdersOf finds who holds what the wait v waits for: in-process holders
// from the lock tables and the advisory-lock tracking and, on Postgres,
// the backends pg_blocking_pids names, followed to the root of the chain,
// each identified where it is a connection of a lockhooks database (of
// this process or another), or, for a wait that does not wait on the
// server (through a transaction pooler lockhooks polls), the backends
// pg_locks shows holding its advisory keys.
func (c *connector) holdersOf(ctx context.Context, v waitView) *holders.Blockage {
	b := &holders.Blockage{Holders: c.inProcessHolders(v, c.inProcessEdges()), At: time.Now()}
	if c.opts.dialect != Postgres || v.Waiter == nil || v.Waiter.pin.PID.Load() == 0 {
		return b
	}
	ahead := c.turnAhead(v.Waiter)
	asked := []*conn{v.Waiter}
	if ahead != nil {
		asked = append(asked, ahead)
	}
	blocked, err := c.blocking.Blocked(ctx, asked)
	bb := blocked[v.Waiter]
	if bb == nil && ahead != nil && blocked[ahead] != nil {
		bb = blocked[ahead].BehindInMemory()
	}
	switch {
	case err != nil:
		b.Err = err
	case bb != nil:
		addBlockers(b, bb.Blockers, v.AdvKeys)
		b.Queued = bb.QueuedAhead
	case len(b.Holders) == 0 && len(v.AdvKeys) > 0:
		addBlockers(b, c.keyHolders(ctx, v.Waiter, v.AdvKeys), v.AdvKeys)
	}
	return b // otherwise not waiting on the server (an in-process queue)
}

// inProcessHolders returns the holders in this process of what v waits
// for: from the lock tables' edges, and from the advisory-lock tracking.
func (c *connector) inProcessHolders(v waitView, edges []inprocess.Edge) []holders.Holder {
	holders := []holders.Holder{}
	if v.Waiter == nil {
		return holders
	}
	for _, e := range edges {
		if ownerConn(e.Waiter) == v.Waiter {
			holders = append(holders, e.Holder)
		}
	}
	if c.pins != nil {
		for _, k := range v.AdvKeys {
			holders = append(holders, holding.Among(c.pins.Snapshot(), k, v.Waiter)...)
		}
	}
	return holders
}

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

// inProcessEdges lists who waits for whom in the database's in-process
// locks (inprocess.Tables.Edges).
func (c *connector) inProcessEdges() []inprocess.Edge {
	return inprocess.Tables{Named: &c.named, Turns: &c.turns, Locksets: &c.locksets, Writer: &c.writer.core, DescribeKey: describeKey,
		AwaitsOnServer: func(owner any, key int64) bool {
			o, ok := owner.(*conn)
			return ok && o.awaitsOnServer(key)
		}}.Edges(ownerHolder)
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
		addBlockers(b, c.connector.keyHolders(ctx, c, w.AdvisoryKeys()), w.AdvisoryKeys())
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
