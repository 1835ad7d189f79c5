package dberr

import (
	"database/sql/driver"
	"errors"
	"io"
	"net"
	"reflect"
	"strings"
	"syscall"
)

// Postgres SQLSTATEs that lockhooks classifies.
const (
	Deadlock                 = "40P01" // deadlock_detected
	SerializationFailure     = "40001" // serialization_failure
	LockNotAvailable         = "55P03" // lock_not_available: lock_timeout, NOWAIT
	IdleInTransactionTimeout = "25P03" // idle_in_transaction_session_timeout: FATAL, the session ended
)

// SQLite result codes that lockhooks classifies (extended codes keep the
// primary code in their low byte).
const (
	SQLiteBusy         = 5
	SQLiteLocked       = 6
	SQLiteBusySnapshot = SQLiteBusy | 2<<8 // 517
)

// SQLState returns the SQLSTATE of err or of an error it wraps, "" when it
// has none.
func SQLState(err error) string {
	if err == nil {
		return "" // (errors.As makes pg escape: an allocation)
	}
	var pg interface{ SQLState() string }
	if errors.As(err, &pg) {
		return pg.SQLState()
	}
	return ""
}

// FromServer reports whether err is an error the database reported (a
// Postgres SQLSTATE or an SQLite result code), after which the connection
// is still usable.
func FromServer(err error) bool {
	var pg interface{ SQLState() string }
	if errors.As(err, &pg) {
		return true
	}
	var lite interface{ Code() int }
	return errors.As(err, &lite)
}

// SQLiteCode returns err's SQLite result code (the extended one, where the
// driver reports it, as modernc.org/sqlite does) and whether err has one.
func SQLiteCode(err error) (int, bool) {
	var lite interface{ Code() int }
	if errors.As(err, &lite) {
		return lite.Code(), true
	}
	return 0, false
}

// ConnectionLost reports whether err says the connection to the server
// broke or the server is going away, rather than that the server rejected
// the statement: SQLSTATE classes 08 (connection exception) and 57
// (operator intervention: pg_terminate_backend, shutdown, 57P05
// idle_session_timeout; 57014, a cancelled statement, is not one), 25P03
// (idle_in_transaction_session_timeout, a FATAL that ends the session),
// driver.ErrBadConn, an unexpected EOF, a network error or a reset
// connection.
func ConnectionLost(err error) bool {
	if err == nil {
		return false
	}
	if s := SQLState(err); s != "" {
		return strings.HasPrefix(s, "08") || (strings.HasPrefix(s, "57") && s != "57014") || s == IdleInTransactionTimeout
	}
	if _, ok := SQLiteCode(err); ok {
		return false
	}
	var ne net.Error
	return errors.Is(err, driver.ErrBadConn) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) ||
		errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.As(err, &ne)
}

// SessionEnded reports whether err, if it is the server's (one with a
// SQLSTATE: isServer), says the server ended the session: a
// connection-exception (class 08), 57P01 (pg_terminate_backend), 57P02
// and 57P03 (crash and shutdown), 57P05 (idle_session_timeout), 25P03
// (idle_in_transaction_session_timeout), or any error of severity FATAL
// or PANIC (the server ends the session after it).
func SessionEnded(err error) (ended, isServer bool) {
	var pg interface{ SQLState() string }
	if !errors.As(err, &pg) {
		return false, false
	}
	switch code := pg.SQLState(); {
	case strings.HasPrefix(code, "08"), code == "57P01", code == "57P02", code == "57P03", code == "57P05", code == IdleInTransactionTimeout:
		return true, true
	}
	return Fatal(err), true
}

// Fatal reports whether a server error has severity FATAL or PANIC: the
// server ends the session after sending it. Neither pgx's
// *pgconn.PgError nor lib/pq's *pq.Error has a method for it, only string
// fields (SeverityUnlocalized, which does not depend on lc_messages, and
// Severity), read by reflection so that no driver is imported.
func Fatal(err error) bool {
	s := Field(err, "SeverityUnlocalized")
	if s == "" {
		s = Field(err, "Severity")
	}
	return s == "FATAL" || s == "PANIC"
}

// Detail returns the DETAIL of a Postgres error, "" when it has none.
// Neither pgx's *pgconn.PgError nor lib/pq's *pq.Error has a method for
// it, only a string field named Detail, which is read by reflection.
func Detail(err error) string { return Field(err, "Detail") }

// Where returns the CONTEXT of a Postgres error (pgx's and lib/pq's Where
// field): for a deadlock, which row the statement waited for, and the
// foreign-key check's query when it was one.
func Where(err error) string { return Field(err, "Where") }

// Field returns the string field name of the first error in err's chain
// that is (or points to) a struct with one, "" when none has it. It reads
// the field by reflection, so no driver's error type is named.
func Field(err error, name string) string {
	for e := err; e != nil; e = errors.Unwrap(e) {
		v := reflect.ValueOf(e)
		for v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface {
			if v.IsNil() {
				break
			}
			v = v.Elem()
		}
		if v.Kind() != reflect.Struct {
			continue
		}
		if f := v.FieldByName(name); f.IsValid() && f.Kind() == reflect.String {
			return f.String()
		}
	}
	return ""
}
