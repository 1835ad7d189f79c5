package lockhooks

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/lockhooks/lockhooks/internal/inprocess"
	"github.com/lockhooks/lockhooks/internal/sqlitelock"
)

// writerLock is the in-process lock that serialises SQLite writers of one
// database (see sqlitelock.Writer), with the errors, events and wait spans
// lockhooks reports for it. Taking it uncontended allocates nothing.
type writerLock struct {
	core inprocess.Writer
}

// lock takes the writer lock for owner, waiting at most timeout (0: no
// limit beyond ctx). stmt is the autocommit statement that takes it, or ""
// for a transaction (begun with ctx, RunInTx's when it began it), whose
// call site is recorded (see sqlitelock.Writer).
func (w *writerLock) lock(ctx context.Context, tel *reporting, owner any, timeout time.Duration, stmt string) error {
	taker := inprocess.Taker{Chain: chainOf(ctx, runOf(ctx)), Span: trace.SpanContextFromContext(ctx), Hint: inprocess.HintTx}
	if stmt != "" {
		taker.Hint = inprocess.HintStmt
	}
	if w.core.TryTake(owner, &taker, stmt) {
		return nil
	}
	return w.lockContended(ctx, tel, owner, taker, timeout, stmt)
}

// lockContended is lock past its uncontended attempt, apart so that the
// uncontended path keeps a small frame: it copies no holder.
func (w *writerLock) lockContended(ctx context.Context, tel *reporting, owner any, taker inprocess.Taker, timeout time.Duration, stmt string) (err error) {
	tk, h, self := w.core.Take(ctx, owner, taker, stmt)
	if self {
		// The holder is the transaction of RunInTx's fn, which runs on
		// this goroutine: it cannot end while we wait.
		holder := inprocess.WriterHolder{WriterHolder: h}
		waiter := "BeginTx of a write transaction"
		if stmt != "" {
			waiter = fmt.Sprintf("the statement %.120q", stmt)
		}
		err := inprocess.SelfWaitError(waiter, "the SQLite writer lock", holder.Identity(ownerHolder))
		tel.events.Add(eventSelfWait, err.Error())
		return err
	}
	if tk == nil {
		return nil
	}
	holder := inprocess.WriterHolder{WriterHolder: h}
	hint := tk.Hint()

	// Contended: time the wait, linked to the holder.
	_, wait := tel.watch.Start(ctx, "sqlite_writer", "exclusive", "transaction")
	wait.SetWaiter(ownerConn(owner), "", tk.Site(), stmt, nil)
	wait.NoteSelfHint(hint)
	if wait.WantsHolder() {
		wait.HeldBy(holder.Identity(ownerHolder))
	}
	defer func() { wait.End(ctx, "", err) }()

	h, err = w.core.Wait(ctx, tk, timeout)
	if err == nil {
		return nil
	}
	holder = inprocess.WriterHolder{WriterHolder: h}
	if hint != "" {
		hint = " (" + hint + ")"
	}
	if err != sqlitelock.ErrTimeout {
		// Cancelled or past its deadline: say what it waited for, how long,
		// and who holds it, still wrapping the context's error.
		return fmt.Errorf("lockhooks: gave up waiting for the SQLite writer lock after %v; held by %s%s: %w",
			time.Since(tk.Since()).Round(time.Millisecond), holder.Describe(ownerHolder), hint, err)
	}
	err = fmt.Errorf("%w: waited %v; held by %s%s; shorten write transactions or raise the busy timeout (lockhooks.WithBusyTimeout)",
		ErrWriterLockTimeout, timeout, holder.Describe(ownerHolder), hint)
	tel.events.Add(eventWriterTimeout, err.Error())
	return err
}

// noteStatementInTx is called at each statement of the transaction that
// holds the writer lock: if a waiter asked where that transaction is, it
// records the statement's call site. Otherwise it costs one atomic load.
func (w *writerLock) noteStatementInTx(owner any) { w.core.NoteStatementInTx(owner) }

// unlock releases the writer lock, handing it to the first waiter.
func (w *writerLock) unlock() { w.core.Unlock() }
