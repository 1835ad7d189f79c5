package retry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"
)

// pgError is a Postgres error as a driver reports it: it has a SQLSTATE.
type pgError string

func (e pgError) Error() string    { return "ERROR: SQLSTATE " + string(e) }
func (e pgError) SQLState() string { return string(e) }

// sqliteError is an SQLite error as modernc.org/sqlite reports it.
type sqliteError int

func (e sqliteError) Error() string { return fmt.Sprintf("sqlite: result code %d", int(e)) }
func (e sqliteError) Code() int     { return int(e) }

func TestDefaults(t *testing.T) {
	c := Defaults()
	want := Config{MaxAttempts: 10, Backoff: Backoff{Base: 5 * time.Millisecond, Cap: time.Second}, CommitCheck: true, ResolveTimeout: 10 * time.Second}
	if c != want {
		t.Errorf("Defaults() = %+v, want %+v", c, want)
	}
}

// The wait after attempt n is at most min(Cap, Base·2^(n-1)), never
// negative, and none without a base; attempts past 31 do not overflow.
func TestBackoffAfter(t *testing.T) {
	b := Backoff{Base: time.Millisecond, Cap: 20 * time.Millisecond}
	for attempt := 1; attempt <= 70; attempt++ {
		limit := min(b.Cap, b.Base<<min(attempt-1, 40))
		if attempt > 40 {
			limit = b.Cap
		}
		for range 50 {
			if d := b.After(attempt); d < 0 || d > limit {
				t.Fatalf("After(%d) = %v, want within [0, %v]", attempt, d, limit)
			}
		}
	}
	if d := (Backoff{Cap: time.Second}).After(3); d != 0 {
		t.Errorf("no base: After(3) = %v, want 0", d)
	}
	// Full jitter: the waits spread over the range, not stuck at its top.
	seen := map[bool]bool{}
	for range 200 {
		seen[b.After(5) < 8*time.Millisecond] = true
	}
	if !seen[true] || !seen[false] {
		t.Errorf("After(5) always on one side of 8ms, out of [0, 16ms]: %v", seen)
	}
}

func TestRetryable(t *testing.T) {
	lost := BeforeCommit(t.Context(), io.ErrUnexpectedEOF)
	for _, tc := range []struct {
		name       string
		err        error
		transient  bool
		retryable  bool
		withLockNA bool // retryable with LockNotAvailable
	}{
		{"deadlock", pgError("40P01"), true, true, true},
		{"serialization failure", fmt.Errorf("wrapped: %w", pgError("40001")), true, true, true},
		{"lock_not_available", pgError("55P03"), false, false, true},
		{"idle in transaction timeout", pgError("25P03"), false, true, true},
		{"unique violation", pgError("23505"), false, false, false},
		{"SQLITE_BUSY", sqliteError(5), true, true, true},
		{"SQLITE_BUSY_SNAPSHOT", sqliteError(517), true, true, true},
		{"SQLITE_LOCKED", sqliteError(6), true, true, true},
		{"SQLITE_CONSTRAINT", sqliteError(19), false, false, false},
		{"connection lost before COMMIT", lost, false, true, true},
		{"a bare EOF of fn's own", io.EOF, false, false, false},
		{"nil", nil, false, false, false},
	} {
		if got := Transient(tc.err); got != tc.transient {
			t.Errorf("%s: Transient = %v, want %v", tc.name, got, tc.transient)
		}
		c := Defaults()
		if got := c.Retryable(tc.err); got != tc.retryable {
			t.Errorf("%s: Retryable = %v, want %v", tc.name, got, tc.retryable)
		}
		c.LockNotAvailable = true
		if got := c.Retryable(tc.err); got != tc.withLockNA {
			t.Errorf("%s: Retryable with LockNotAvailable = %v, want %v", tc.name, got, tc.withLockNA)
		}
	}
}

// An error met before COMMIT is retryable only when the connection broke
// while the context was live; it wraps the error as it was.
func TestBeforeCommit(t *testing.T) {
	c := Defaults()
	err := BeforeCommit(t.Context(), pgError("08006"))
	if !c.Retryable(err) || err.Error() != pgError("08006").Error() || !errors.Is(err, pgError("08006")) {
		t.Errorf("a broken connection before COMMIT: %v (retryable %v)", err, c.Retryable(err))
	}
	if err := BeforeCommit(t.Context(), pgError("42P01")); err != pgError("42P01") {
		t.Errorf("a server error before COMMIT changed: %v", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := BeforeCommit(ctx, io.ErrUnexpectedEOF); err != io.ErrUnexpectedEOF || c.Retryable(err) {
		t.Errorf("a broken connection after the context ended: %v, retryable %v", err, c.Retryable(err))
	}
}

// Sleep waits its duration, and ends early with the context's cause.
func TestSleep(t *testing.T) {
	if err := Sleep(context.Background(), time.Millisecond); err != nil {
		t.Fatalf("Sleep with a live context: %v", err)
	}
	cause := errors.New("shutting down")
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(cause)
	if err := Sleep(ctx, time.Hour); err != cause {
		t.Fatalf("Sleep with an ended context: %v, want its cause", err)
	}
}
