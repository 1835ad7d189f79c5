package retry

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

// fakeServer answers a resolution's questions from a script: one answer
// per Status call (the last one repeated), and Terminate's error.
type fakeServer struct {
	answers    []answer
	terminate  error
	asked      int
	terminated int
	xids       []string
}

type answer struct {
	status      string
	valid, idle bool
	err         error
}

func (s *fakeServer) Status(ctx context.Context, xid string) (string, bool, bool, error) {
	s.xids = append(s.xids, xid)
	a := s.answers[min(s.asked, len(s.answers)-1)]
	s.asked++
	return a.status, a.valid, a.idle, a.err
}

func (s *fakeServer) Terminate(ctx context.Context, xid string) error {
	s.terminated++
	return s.terminate
}

// What a failed COMMIT means, by how it failed and what the server says
// of the transaction afterwards.
func TestCommitFailed(t *testing.T) {
	cut := io.ErrUnexpectedEOF // the connection broke while COMMIT was in flight
	for _, tc := range []struct {
		name       string
		err        error
		sqlite     bool
		skipCheck  bool
		xid        string
		answers    []answer
		terminate  error
		want       string // "" for success; "retry: ..." for a retryable error, else a part of the error
		asked      int
		terminated int
	}{
		{name: "rejected by the server", err: pgError("23505"), xid: "7", want: "ERROR: SQLSTATE 23505"},
		{name: "aborted by a failed statement", err: pgError("25P02"), xid: "7", want: "fn returned nil, but a statement of the transaction failed"},
		{name: "SQLite", err: cut, sqlite: true, want: "lockhooks can ask only Postgres"},
		{name: "SQLite's own error is a rejection", err: sqliteError(19), sqlite: true, want: "sqlite: result code 19"},
		{name: "commit check off", err: cut, skipCheck: true, xid: "7", want: "lockhooks.SkipCommitCheck() kept RunInTx"},
		{name: "standby", err: cut, want: "retry: lockhooks: COMMIT of a transaction on a standby"},
		{name: "committed", err: cut, xid: "7", answers: []answer{{status: "committed", valid: true}}, asked: 1},
		{name: "committed after the server went away", err: pgError("57P01"), xid: "7", answers: []answer{{status: "committed", valid: true}}, asked: 1},
		{name: "aborted", err: cut, xid: "7", answers: []answer{{status: "aborted", valid: true}}, want: "retry: lockhooks: COMMIT of transaction 7 failed with unexpected EOF; pg_xact_status says it aborted", asked: 1},
		{name: "idle in the transaction: ended, then aborted", err: cut, xid: "7",
			answers: []answer{{status: "in progress", valid: true, idle: true}, {status: "aborted", valid: true}}, want: "retry: ", asked: 2, terminated: 1},
		{name: "still in progress, not idle: asked until the timeout", err: cut, xid: "7",
			answers: []answer{{status: "in progress", valid: true}}, want: `the server could not say whether it committed: pg_xact_status still said "in progress" after 30ms`, asked: -1},
		{name: "ending the idle backend fails: it is tried once, then asked about until the timeout", err: cut, xid: "7", terminate: pgError("42501"),
			answers: []answer{{status: "in progress", valid: true, idle: true}}, want: "the server could not say whether it committed", asked: -1, terminated: 1},
		{name: "too old for the commit log", err: cut, xid: "7", answers: []answer{{}}, want: "pg_xact_status returned NULL", asked: 1},
		{name: "no pg_xact_status", err: cut, xid: "7", answers: []answer{{err: pgError("42883")}}, want: "asking pg_xact_status: ERROR: SQLSTATE 42883", asked: 1},
		{name: "the other connection breaks, then answers", err: cut, xid: "7",
			answers: []answer{{err: pgError("08006")}, {err: io.EOF}, {status: "committed", valid: true}}, asked: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Defaults()
			c.CommitCheck = !tc.skipCheck
			c.ResolveTimeout = 30 * time.Millisecond
			s := &fakeServer{answers: tc.answers, terminate: tc.terminate}
			err := c.CommitFailed(t.Context(), tc.err, !tc.sqlite, tc.xid, s)
			switch want, retry := strings.CutPrefix(tc.want, "retry: "); {
			case tc.want == "":
				if err != nil {
					t.Fatalf("err = %v, want success", err)
				}
			case err == nil:
				t.Fatalf("success, want an error with %q", want)
			case !strings.Contains(err.Error(), want):
				t.Errorf("err = %v, want one with %q", err, want)
			case c.Retryable(err) != retry:
				t.Errorf("retryable %v, want %v: %v", !retry, retry, err)
			case !retry && tc.asked != 0 && !errors.Is(err, ErrAmbiguousCommit) && tc.err == cut:
				t.Errorf("an unresolved COMMIT does not wrap ErrAmbiguousCommit: %v", err)
			}
			if err != nil && tc.err != nil && !errors.Is(err, tc.err) {
				t.Errorf("the error does not wrap COMMIT's: %v", err)
			}
			if tc.asked >= 0 && s.asked != tc.asked || tc.asked < 0 && s.asked < 2 {
				t.Errorf("asked the server %d times, want %d (-1: until the timeout)", s.asked, tc.asked)
			}
			if s.terminated != tc.terminated {
				t.Errorf("ended the idle backend %d times, want %d", s.terminated, tc.terminated)
			}
			for _, xid := range s.xids {
				if xid != tc.xid {
					t.Errorf("asked about transaction %q, want %q", xid, tc.xid)
				}
			}
		})
	}
}

// COMMIT met the context's own error: database/sql never sent it.
func TestCommitFailedContextEnded(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	c := Defaults()
	s := &fakeServer{answers: []answer{{status: "committed", valid: true}}}
	if err := c.CommitFailed(ctx, ctx.Err(), true, "7", s); err != context.Canceled || s.asked != 0 {
		t.Errorf("err = %v after asking %d times, want context.Canceled without asking", err, s.asked)
	}
}

// The resolution asks on even when the context ended while COMMIT was in
// flight: the question must be answered.
func TestResolveOutlivesTheContext(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	c := Defaults()
	s := &fakeServer{answers: []answer{{status: "in progress", valid: true}, {status: "committed", valid: true}}}
	if err := c.CommitFailed(ctx, pgError("08006"), true, "7", s); err != nil || s.asked != 2 {
		t.Errorf("err = %v after asking %d times, want success after 2", err, s.asked)
	}
}

func TestBeginAndXIDFailed(t *testing.T) {
	if err := BeginFailed(t.Context(), pgError("42883")); !strings.Contains(err.Error(), "needs Postgres 13 or later; pass lockhooks.SkipCommitCheck()") || !errors.Is(err, pgError("42883")) {
		t.Errorf("BEGIN without pg_current_xact_id: %v", err)
	}
	if err := BeginFailed(t.Context(), pgError("28P01")); err != pgError("28P01") {
		t.Errorf("BEGIN's own error changed: %v", err)
	}
	c := Defaults()
	if err := BeginFailed(t.Context(), io.ErrUnexpectedEOF); !c.Retryable(err) {
		t.Errorf("BEGIN on a broken connection is not retryable: %v", err)
	}
	if err := XIDFailed(t.Context(), pgError("25P02")); !strings.HasPrefix(err.Error(), "lockhooks: RunInTx: fn returned nil, but a statement") {
		t.Errorf("the id query in an aborted transaction: %v", err)
	}
	if err := XIDFailed(t.Context(), io.ErrUnexpectedEOF); !strings.HasPrefix(err.Error(), "lockhooks: RunInTx: reading the transaction id before COMMIT: ") || !c.Retryable(err) {
		t.Errorf("the id query on a broken connection: %v (retryable %v)", err, c.Retryable(err))
	}
}

func TestCommitInfo(t *testing.T) {
	var info CommitInfo
	for _, tc := range []struct {
		v    any
		want string
	}{{"742", "742"}, {[]byte("743"), "743"}, {nil, ""}, {int64(744), "744"}, {uint32(745), "745"}} {
		info.XID = "stale"
		if info.SetXID(tc.v); info.XID != tc.want {
			t.Errorf("SetXID(%#v): %q, want %q", tc.v, info.XID, tc.want)
		}
	}
	ctx := t.Context()
	if InfoOf(ctx) != nil {
		t.Error("a plain context carries a CommitInfo")
	}
	if got := InfoOf(context.WithValue(ctx, InfoKey{}, &info)); got != &info {
		t.Errorf("InfoOf = %p, want %p", got, &info)
	}
}
