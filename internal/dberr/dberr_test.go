package dberr

import (
	"database/sql/driver"
	"fmt"
	"io"
	"syscall"
	"testing"
)

// pgError has the shape of pgx's *pgconn.PgError and lib/pq's *pq.Error
// as far as this package reads them: a SQLState method and string fields.
type pgError struct {
	Code, Detail, Where, Severity string
}

func (e *pgError) Error() string    { return "ERROR: " + e.Code }
func (e *pgError) SQLState() string { return e.Code }

// liteError has the shape of modernc.org/sqlite's *sqlite.Error.
type liteError struct{ code int }

func (e *liteError) Error() string { return fmt.Sprintf("sqlite %d", e.code) }
func (e *liteError) Code() int     { return e.code }

func TestClassification(t *testing.T) {
	deadlock := fmt.Errorf("lockhooks: …: %w", &pgError{Code: Deadlock, Detail: "Process 1 waits", Where: "while locking tuple (0,1)"})
	if got := SQLState(deadlock); got != Deadlock {
		t.Errorf("SQLState through a wrap = %q", got)
	}
	if SQLState(nil) != "" || SQLState(io.EOF) != "" {
		t.Error("SQLState of an error without one is not empty")
	}
	if Detail(deadlock) != "Process 1 waits" || Where(deadlock) != "while locking tuple (0,1)" || Field(deadlock, "Missing") != "" {
		t.Errorf("fields: Detail %q, Where %q", Detail(deadlock), Where(deadlock))
	}
	busy := fmt.Errorf("wrapped: %w", &liteError{SQLiteBusySnapshot})
	if code, ok := SQLiteCode(busy); !ok || code != SQLiteBusySnapshot || code&0xff != SQLiteBusy {
		t.Errorf("SQLiteCode = %d, %v", code, ok)
	}
	for _, c := range []struct {
		err  error
		lost bool
	}{
		{&pgError{Code: "08006"}, true},
		{&pgError{Code: "57P01"}, true},                  // terminated by pg_terminate_backend
		{&pgError{Code: "57014"}, false},                 // a cancelled statement: the session lives on
		{&pgError{Code: IdleInTransactionTimeout}, true}, // a FATAL that ends the session
		{&pgError{Code: Deadlock}, false},                // the server refused the statement
		{&liteError{SQLiteBusy}, false},                  // SQLite has no connection to lose
		{driver.ErrBadConn, true},
		{fmt.Errorf("read: %w", io.ErrUnexpectedEOF), true},
		{fmt.Errorf("write: %w", syscall.ECONNRESET), true},
		{nil, false},
		{fmt.Errorf("no rows"), false},
	} {
		if got := ConnectionLost(c.err); got != c.lost {
			t.Errorf("ConnectionLost(%v) = %v, want %v", c.err, got, c.lost)
		}
	}
}

// SQLState of nil allocates nothing: it is on every statement's path.
func TestSQLStateOfNilAllocatesNothing(t *testing.T) {
	if n := testing.AllocsPerRun(100, func() { _ = SQLState(nil) }); n != 0 {
		t.Errorf("SQLState(nil): %v allocations", n)
	}
}

// An error is the server's when it, or one it wraps, has a SQLSTATE or an
// SQLite result code; a network error or a driver's own is not.
func TestFromServer(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{&pgError{Code: "40001"}, true},
		{fmt.Errorf("wrapped: %w", &pgError{Code: "57014"}), true},
		{&liteError{code: 5}, true},
		{fmt.Errorf("wrapped: %w", &liteError{code: 517}), true},
		{driver.ErrBadConn, false},
		{io.ErrUnexpectedEOF, false},
		{nil, false},
	} {
		if got := FromServer(c.err); got != c.want {
			t.Errorf("FromServer(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// localizedError has pgx's two severities: SeverityUnlocalized, which does
// not depend on lc_messages, is read first.
type localizedError struct {
	pgError
	SeverityUnlocalized string
}

// The server ended the session with a connection exception, a
// termination, a session timeout, or any FATAL or PANIC; other server
// errors leave it open; an error that is not the server's says nothing.
func TestSessionEnded(t *testing.T) {
	for _, c := range []struct {
		err             error
		ended, isServer bool
	}{
		{&pgError{Code: "08006"}, true, true},
		{&pgError{Code: "57P01"}, true, true},
		{&pgError{Code: "57P02"}, true, true},
		{&pgError{Code: "57P03"}, true, true},
		{fmt.Errorf("wrapped: %w", &pgError{Code: "57P05"}), true, true},
		{&pgError{Code: IdleInTransactionTimeout}, true, true},
		{&pgError{Code: "53300", Severity: "FATAL"}, true, true}, // too many connections
		{&pgError{Code: "XX000", Severity: "PANIC"}, true, true},
		{&pgError{Code: "57014", Severity: "ERROR"}, false, true}, // a cancelled statement
		{&pgError{Code: "40P01"}, false, true},
		{&localizedError{pgError: pgError{Code: "53300", Severity: "SCHWERWIEGEND"}, SeverityUnlocalized: "FATAL"}, true, true},
		{&localizedError{pgError: pgError{Code: "53300", Severity: "FATAL"}, SeverityUnlocalized: "ERROR"}, false, true},
		{driver.ErrBadConn, false, false},
		{io.ErrUnexpectedEOF, false, false},
	} {
		if ended, isServer := SessionEnded(c.err); ended != c.ended || isServer != c.isServer {
			t.Errorf("SessionEnded(%v) = %v, %v; want %v, %v", c.err, ended, isServer, c.ended, c.isServer)
		}
	}
}
