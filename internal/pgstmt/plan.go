package pgstmt

import (
	"context"
	"database/sql/driver"
	"fmt"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
	"github.com/lockhooks/lockhooks/internal/pgsession"
	"github.com/lockhooks/lockhooks/internal/rawconn"
	"github.com/lockhooks/lockhooks/internal/sqlscan"
	"github.com/lockhooks/lockhooks/internal/stmtlocks"
	"github.com/lockhooks/lockhooks/internal/telemetry"
	"github.com/lockhooks/lockhooks/internal/waits"
)

// Plan is what lockhooks does around one statement that calls
// advisory-lock functions, takes row locks, or runs on a connection
// holding session locks: made before it runs ([Database.Before]) and
// applied after ([Database.After]).
type Plan[C Conn[K], K advisorykey.Named] struct {
	// Plan is what the session-lock tracking knows of the statement (its
	// advisory calls, text, site, keys), which it applies after it
	// (pgsession.Conn.After).
	pgsession.Plan[K]
	St   Statement
	Args []driver.NamedValue
	// Wait is the statement's lock wait, when it takes locks.
	Wait *waits.Lock[C, K]
	// Sent is the text the statement runs with when it is not its own: an
	// exact session-lock statement on a connection that reaches the server
	// itself carries the holder's annotation instead of a pg_locks read
	// after it (pgsession.Conn.LockText); "" otherwise.
	Sent string
	// Turn: the statement took its key's turn in the in-process queue
	// before it was sent (turns.go).
	Turn bool
}

// FencingToken is the expression of an AdvisoryLock's fencing token:
// NULL on a hot standby, where pg_current_xact_id() fails (25006).
const FencingToken = "(CASE WHEN pg_is_in_recovery() THEN NULL ELSE pg_current_xact_id() END)::text::bigint"

// tokenAfterLock marks the context of a lock statement that also returns
// the fencing token (WithFencingToken).
type tokenAfterLock struct{}

// WithFencingToken marks ctx as the context of AcquireAdvisoryLock's lock
// statement on a connection to the server itself: the statement, which
// lockhooks sends annotated (pgsession.Conn.LockText), also returns the
// fencing token ([FencingToken]), taken once the lock is granted (the
// target list runs left to right), in its second column. One round trip
// for both; through a pooler the caller reads the token apart.
func WithFencingToken(ctx context.Context) context.Context {
	return context.WithValue(ctx, tokenAfterLock{}, true)
}

// Before runs before a statement of c on the slow path. It may answer
// the statement itself (a rerouted unlock, a try-lock refused in memory):
// then answer is the statement's result. retext says that the
// statement's text may be sent changed (it is not a prepared statement):
// see Plan.Sent.
func (db *Database[C, K]) Before(ctx context.Context, c C, st Statement, args []driver.NamedValue, retext bool) (plan Plan[C, K], answer *rawconn.Row, err error) {
	plan = Plan[C, K]{Plan: pgsession.Plan[K]{Adv: st.Advisory, Text: st.Text}, St: st, Args: args}
	pin := c.Pin()
	pin.Trips.Sent(st.Text)
	pin.Lock()
	lost := pin.Lost
	pin.Unlock()
	if lost != nil {
		return plan, nil, lost
	}
	if db.Sessions != nil {
		if err := pin.RefuseThroughPooler(st.Advisory, db.Sessions.PoolerSeen()); err != nil {
			return plan, nil, err
		}
	}
	if pin.Active.Load() {
		// database/sql would let the driver see a cancelled context, and pgx
		// then closes the connection: every lock it holds would be gone.
		if err := ctx.Err(); err != nil {
			return plan, nil, err
		}
		pin.VerifyUnknown(ctx)
	}
	adv := st.Advisory
	if adv == nil {
		if err := pin.Hold.Check(ctx); err != nil {
			return plan, nil, err
		}
		if st.RowLock {
			plan.Wait = db.startRowLockWait(ctx, c, st)
		}
		return plan, nil, nil
	}
	plan.Keys, plan.Known = pgsession.KeySlices[K](len(adv.Calls))
	plan.Exact = adv.TargetList && !adv.Uncertain
	plan.Verify = !plan.Exact && !adv.DiscardAll
	for i, call := range adv.Calls {
		key, ok := stmtlocks.KeyOf(call, args)
		k := K(key)
		if !ok && call.Func&sqlscan.FnUnlockAll == 0 && adv.TargetList && !adv.Uncertain {
			if k, ok = c.EvalKey(ctx, call, args); ok {
				plan.Verify = true
			}
		}
		plan.Keys[i], plan.Known[i] = k, ok || call.Func&sqlscan.FnUnlockAll != 0
		plan.Exact = plan.Exact && plan.Known[i]
	}
	if pin.AnyApprox(plan.Keys, plan.Known) {
		plan.Verify = true
	}
	if plan.OnHolder, err = pin.OnHolder(adv); err != nil {
		return plan, nil, err
	}
	if !plan.OnHolder {
		if err := pin.Hold.Check(ctx); err != nil {
			return plan, nil, err
		}
	}
	set := db.Sessions.Settings()
	if set.TxPooler {
		if err := pin.SplitConflict(adv, plan.Keys, plan.Known); err != nil {
			return plan, nil, err
		}
	}
	if err := pin.RefuseUselessXact(ctx, adv); err != nil {
		return plan, nil, err
	}
	if adv.Simple && adv.Calls[0].Func&sqlscan.FnUnlock != 0 && plan.Known[0] && !pin.Holds(plan.Keys[0]) {
		if err := db.Reroute(ctx, c, plan.Keys[0]); err != nil {
			return plan, nil, err
		}
		return plan, rawconn.OneValue(adv.Calls[0].Column, true), nil
	}
	if stmtlocks.OneSessionLock(adv) && adv.Calls[0].Func == sqlscan.FnTry {
		// A try-lock takes the key's turn if it is free, and is answered
		// false without the server if another connection of this database
		// holds or awaits the key (turns.go).
		if key, ok := turnKey(c, &plan); ok {
			if !db.Turns.TryLock(key, c, db.Taker(ctx, c), nil) {
				// Counted and traced as a try-lock the server refused.
				db.startAdvisoryWait(ctx, c, adv, plan.Keys, plan.Known, c.Site(ctx)).End(ctx, telemetry.OutcomeNotAcquired, nil)
				return plan, rawconn.OneValue(adv.Calls[0].Column, false), nil
			}
			pin.NotePendingTurn(key)
			plan.Turn = true
		}
	}
	annotate := false
	if !plan.OnHolder && plan.Exact && !set.TxPooler && pgsession.TakesOrFreesSession(adv) {
		// A session lock through a transaction-mode pooler would land on a
		// server connection other clients reuse: pg_locks, read right
		// after, says whether it is where this connection is, and the read
		// names the holder to other processes. A connection that reaches
		// the server itself needs neither: the statement's text and result
		// tell its effect, and the statement names the holder itself.
		annotate = !plan.Verify && retext && adv.Simple && c.Direct() && set.Own.Exec != nil && set.Own.OK() && stmtlocks.IntegerArgs(args)
		plan.Verify = !annotate
	}
	plan.Site = c.Site(ctx)
	if annotate {
		// The text may change with every hold: the adapter runs it
		// uncached unless the connection sent it lately, and either way
		// the server shows it as sent, which an end request compares
		// (pgsession.EndTarget). suffix is AcquireAdvisoryLock's fencing
		// token (WithFencingToken).
		suffix := ""
		if adv.Calls[0].Func&(sqlscan.FnTry|sqlscan.FnUnlock|sqlscan.FnUnlockAll|sqlscan.FnXact) == 0 && ctx.Value(tokenAfterLock{}) != nil {
			suffix = ", " + FencingToken
		}
		unlock := adv.Calls[0].Func&sqlscan.FnUnlock != 0
		plan.Sent = pin.LockText(ctx, unlock, plan.Keys[0], plan.Site, st.Text, suffix)
	}
	if plan.Exact && !adv.Simple {
		if err := db.checkUnlocks(c, adv, plan.Keys, plan.Site); err != nil {
			return plan, nil, err
		}
	}
	db.warnSelfWait(c, adv, plan.Keys, plan.Known, plan.Site)
	hint, err := db.SelfWaitAdvisory(ctx, c, func() string { return fmt.Sprintf("the statement %.120q", st.Text) }, stmtlocks.Waiting(adv, plan.Keys, plan.Known), nil)
	if err != nil {
		db.Events.Add(EventSelfWait, err.Error())
		return plan, nil, err
	}
	plan.Wait = db.startAdvisoryWait(ctx, c, adv, plan.Keys, plan.Known, plan.Site)
	plan.Wait.NoteSelfHint(hint)
	if stmtlocks.OneSessionLock(adv) && adv.Calls[0].Func == 0 {
		if key, ok := turnKey(c, &plan); ok {
			if err := db.takeTurn(ctx, c, key); err != nil {
				plan.Wait.End(ctx, "", err)
				return plan, nil, err
			}
			plan.Turn = true
			pin.Trips.Sent(st.Text) // sent now, after its wait in memory (the loss's quiet: pgsession.RoundTrips)
		}
	}
	pin.Lock()
	pin.Busy++
	pin.Gen++
	pin.Unlock()
	return plan, nil, nil
}
