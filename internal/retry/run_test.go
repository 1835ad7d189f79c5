package retry

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

// script is an adapter whose attempts fail with the errors given, in turn,
// then succeed; it records the retries it is told of.
type script struct {
	errs      []error
	ran       int
	retryable func(error) bool
	retries   []int
	cancel    func() // called at the first retry, if set
}

func (s *script) Attempt(context.Context) error {
	s.ran++
	if s.ran <= len(s.errs) {
		return s.errs[s.ran-1]
	}
	return nil
}
func (s *script) Retryable(err error) bool { return s.retryable(err) }
func (s *script) Retrying(_ context.Context, attempt int, _ error, wait time.Duration) {
	s.retries = append(s.retries, attempt)
	if s.cancel != nil {
		s.cancel()
	}
}

var errRetry, errFatal = errors.New("retry me"), errors.New("fatal")

func retryOnly(err error) bool { return errors.Is(err, errRetry) }

// The loop retries what the adapter says is retryable, stops at any other
// error, at MaxAttempts, and when the context ends between attempts.
func TestLoop(t *testing.T) {
	c := Config{MaxAttempts: 3, Backoff: Backoff{Base: time.Microsecond, Cap: time.Microsecond}}
	ctx := context.Background()
	s := &script{errs: []error{errRetry, errRetry}, retryable: retryOnly}
	if out, ok := c.Loop(ctx, s); !ok || s.ran != 3 || len(s.retries) != 2 || s.retries[1] != 2 {
		t.Errorf("two retries, then success: %+v %v, %d ran, retries %v", out, ok, s.ran, s.retries)
	}
	s = &script{errs: []error{errRetry, errFatal}, retryable: retryOnly}
	if out, ok := c.Loop(ctx, s); ok || out.Attempts != 2 || out.Err != errFatal || out.Exhausted || out.Ctx != nil {
		t.Errorf("a fatal error: %+v", out)
	}
	s = &script{errs: []error{errRetry, errRetry, errRetry, errRetry}, retryable: retryOnly}
	if out, ok := c.Loop(ctx, s); ok || out.Attempts != 3 || !out.Exhausted || s.ran != 3 {
		t.Errorf("exhausted: %+v, %d ran", out, s.ran)
	}
	cctx, cancel := context.WithCancelCause(ctx)
	cause := errors.New("shutting down")
	s = &script{errs: []error{errRetry, errRetry}, retryable: retryOnly, cancel: func() { cancel(cause) }}
	long := Config{MaxAttempts: 3, Backoff: Backoff{Base: time.Hour, Cap: time.Hour}} // (a backoff of 0 would skip the wait)
	if out, ok := long.Loop(cctx, s); ok || out.Attempts != 1 || out.Ctx != cause || s.ran != 1 {
		t.Errorf("cancelled in the backoff: %+v, %d ran", out, s.ran)
	}
	if out, ok := c.Loop(cctx, &script{errs: []error{errRetry}, retryable: retryOnly}); ok || out.Attempts != 1 || out.Ctx != cause {
		t.Errorf("the context ended during the attempt: %+v", out)
	}
}

// fakeTx is an adapter's transaction that fails where told, recording
// what ran.
type fakeTx struct {
	ran                               []string
	begin, run, rollback, xid, commit error
	panics                            bool
	server                            fakeServer
}

func (f *fakeTx) Begin(context.Context) (int, error) {
	f.ran = append(f.ran, "begin")
	return 7, f.begin
}
func (f *fakeTx) Run(tx int) error {
	f.ran = append(f.ran, "fn")
	if f.panics {
		panic("fn panicked")
	}
	return f.run
}
func (f *fakeTx) Rollback(int) error { f.ran = append(f.ran, "rollback"); return f.rollback }
func (f *fakeTx) ReadXID(context.Context, int) (string, error) {
	f.ran = append(f.ran, "xid")
	return "812", f.xid
}
func (f *fakeTx) Commit(int) error    { f.ran = append(f.ran, "commit"); return f.commit }
func (f *fakeTx) Done(err error) bool { return errors.Is(err, errTxDone) }
func (f *fakeTx) Server() Server      { return &f.server }

var errTxDone = errors.New("tx done")

// One attempt: begin, fn, the id where BEGIN did not learn it, COMMIT; fn's
// own error is a broken connection's only where ROLLBACK fails too; a
// panicking fn's transaction is rolled back; a COMMIT database/sql never
// sent is returned as it is, another failed COMMIT resolved by the id.
func TestRunAttempt(t *testing.T) {
	ctx := context.Background()
	c := Defaults()
	run := func(f *fakeTx, info *CommitInfo, postgres bool) error {
		return RunAttempt[int](ctx, &c, f, info, postgres)
	}
	var info CommitInfo
	f := &fakeTx{}
	if err := run(f, &info, true); err != nil || strings.Join(f.ran, " ") != "begin fn xid commit" || info.XID != "812" {
		t.Errorf("Postgres without the id at BEGIN: %v, ran %v, xid %q", err, f.ran, info.XID)
	}
	f = &fakeTx{}
	info = CommitInfo{XID: "old", Begun: true}
	if err := run(f, &info, false); err != nil || strings.Join(f.ran, " ") != "begin fn commit" || info.XID != "" {
		t.Errorf("SQLite: %v, ran %v, info %+v (reset)", err, f.ran, info)
	}
	f = &fakeTx{run: io.EOF}
	if err := run(f, &info, false); err != io.EOF || c.Retryable(err) || strings.Join(f.ran, " ") != "begin fn rollback" {
		t.Errorf("fn's own io.EOF, rollback fine: %v (retryable %v), ran %v", err, c.Retryable(err), f.ran)
	}
	f = &fakeTx{run: io.EOF, rollback: io.EOF}
	if err := run(f, &info, false); !errors.Is(err, io.EOF) || !c.Retryable(err) {
		t.Errorf("fn's io.EOF with the connection broken: %v (retryable %v)", err, c.Retryable(err))
	}
	f = &fakeTx{run: io.EOF, rollback: errTxDone}
	if err := run(f, &info, false); err != io.EOF {
		t.Errorf("fn's io.EOF, the transaction done already: %v", err)
	}
	f = &fakeTx{begin: io.EOF}
	if err := run(f, &info, true); !errors.Is(err, io.EOF) || !c.Retryable(err) || strings.Join(f.ran, " ") != "begin" {
		t.Errorf("BEGIN broken: %v, ran %v", err, f.ran)
	}
	f = &fakeTx{xid: io.EOF}
	if err := run(f, &info, true); !errors.Is(err, io.EOF) || !strings.Contains(err.Error(), "reading the transaction id") || strings.Join(f.ran, " ") != "begin fn xid rollback" {
		t.Errorf("the id's read failed: %v, ran %v", err, f.ran)
	}
	f = &fakeTx{commit: errTxDone}
	if err := run(f, &info, true); err != errTxDone || f.server.asked != 0 {
		t.Errorf("COMMIT never sent: %v, server asked %d times", err, f.server.asked)
	}
	f = &fakeTx{commit: io.EOF, server: fakeServer{answers: []answer{{status: "committed", valid: true}}}}
	if err := run(f, &info, true); err != nil || f.server.asked != 1 || f.server.xids[0] != "812" {
		t.Errorf("COMMIT cut off, then committed: %v, asked %d about %v", err, f.server.asked, f.server.xids)
	}
	f = &fakeTx{panics: true}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("fn's panic did not come through")
			}
		}()
		run(f, &info, false)
	}()
	if strings.Join(f.ran, " ") != "begin fn rollback" {
		t.Errorf("after fn's panic: ran %v", f.ran)
	}
}
