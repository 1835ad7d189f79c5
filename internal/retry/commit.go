package retry

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/lockhooks/lockhooks/internal/dberr"
)

// What RunInTx must know to resolve a COMMIT whose reply was cut off,
// learnt on Postgres without a round trip of its own.
//
// A COMMIT cut off in flight can be resolved only through the transaction's
// id (pg_xact_status), and the id must be known before COMMIT is sent: its
// reply is what gets lost. Reading it just before COMMIT costs a round trip
// per attempt, and finds none in a transaction whose only effect is a
// NOTIFY (Postgres assigns that one its id inside COMMIT). So lockhooks
// assigns every attempt its id at BEGIN, in the same round trip: it sends
// the BEGIN itself, in one simple-protocol message with a query of the id.
// A transaction that writes nothing then has an id as well: its COMMIT writes a commit record,
// without waiting for the disk (Postgres commits asynchronously a
// transaction that wrote no WAL before COMMIT), and uses up one transaction
// id. On a standby, where nothing can be written or notified, no id is
// assigned (pg_is_in_recovery()). A transaction that a failed statement
// aborted must not be answered COMMIT's silent ROLLBACK: through pgx,
// lockhooks asks the connection's transaction status (PgConn.TxStatus,
// from the server's last ReadyForQuery, so no round trip) and rolls back
// instead of committing; through other drivers COMMIT is sent as
// "SELECT 1; COMMIT", which fails at the SELECT (25P02).
//
// lockhooks' BEGIN message and COMMIT are internal/pgbegin's, which
// composes the id query with what else the transaction says at BEGIN (its
// identity) and says which drivers and isolation levels allow it. Other
// transactions read the id before COMMIT instead, in a round trip of their
// own (RunInTx's fallback).

// ErrAmbiguousCommit is wrapped by the error of an attempt whose COMMIT
// failed in a way that leaves its outcome unknown, when the server could
// not say what became of the transaction (the root exports it).
var ErrAmbiguousCommit = errors.New("lockhooks: the outcome of COMMIT is unknown")

// CommitInfo is what RunInTx learns about an attempt's transaction; the
// wrapped connection fills it in when it begins the transaction itself.
type CommitInfo struct {
	Begun bool   // lockhooks sent BEGIN, with the id query
	XID   string // the transaction id; "" on a standby (nothing can be written there)
}

// SetXID sets the transaction id from the column of [XIDQuery], as the
// driver returned it (text, bytes, or nil on a standby).
func (i *CommitInfo) SetXID(v any) {
	switch v := v.(type) {
	case string:
		i.XID = v
	case []byte:
		i.XID = string(v)
	case nil:
		i.XID = ""
	case int64:
		i.XID = strconv.FormatInt(v, 10)
	default:
		i.XID = fmt.Sprint(v)
	}
}

// InfoKey is the context key of an attempt's *CommitInfo: the context
// RunInTx begins an attempt with answers Value(InfoKey{}) with it when the
// commit check is on.
type InfoKey struct{}

// InfoOf returns the *CommitInfo that ctx carries, or nil: the transaction
// ctx begins is not a RunInTx attempt with the commit check on.
func InfoOf(ctx context.Context) *CommitInfo {
	info, _ := ctx.Value(InfoKey{}).(*CommitInfo)
	return info
}

// XIDQuery assigns the transaction its id (none on a standby) and returns
// it as text.
const XIDQuery = "SELECT (CASE WHEN pg_is_in_recovery() THEN NULL ELSE pg_current_xact_id() END)::text"

// BeginFailed classifies an error of BEGIN.
func BeginFailed(ctx context.Context, err error) error {
	if dberr.SQLState(err) == "42883" { // lockhooks' BEGIN asks for the transaction id
		err = xidError(err)
	}
	return BeforeCommit(ctx, err)
}

// XIDFailed classifies an error of [XIDQuery] run before COMMIT.
func XIDFailed(ctx context.Context, err error) error {
	return BeforeCommit(ctx, xidError(err))
}

// xidError explains why the transaction id could not be read.
func xidError(err error) error {
	switch dberr.SQLState(err) {
	case "25P02": // in_failed_sql_transaction
		return fmt.Errorf("lockhooks: RunInTx: fn returned nil, but a statement of the transaction failed and Postgres aborted it; return that statement's error from fn: %w", err)
	case "42883": // undefined_function
		return fmt.Errorf("lockhooks: RunInTx gives each attempt a transaction id with pg_current_xact_id(), which needs Postgres 13 or later; pass lockhooks.SkipCommitCheck() on older servers: %w", err)
	}
	return fmt.Errorf("lockhooks: RunInTx: reading the transaction id before COMMIT: %w", err)
}

// BeforeCommit classifies an error met before COMMIT was sent: a broken
// connection there (while ctx is live) means the transaction did not
// commit, and the attempt is retryable.
func BeforeCommit(ctx context.Context, err error) error {
	if ctx.Err() == nil && dberr.ConnectionLost(err) {
		return &attemptError{err: err, beforeWrite: true}
	}
	return err
}

// A Server answers the questions that resolve a COMMIT cut off in flight,
// on a connection other than the transaction's (which is broken).
type Server interface {
	// Status runs StatusQuery with xid: the transaction's status (valid
	// false for NULL), and whether a backend is still idle inside it.
	Status(ctx context.Context, xid string) (status string, valid, idle bool, err error)
	// Terminate runs TerminateQuery with xid.
	Terminate(ctx context.Context, xid string) error
}

// StatusQuery asks what became of transaction $1, and whether the backend
// running it (the one whose backend_xid it is) is still idle inside it:
// then COMMIT never reached it.
const StatusQuery = `SELECT pg_xact_status($1::xid8), EXISTS (SELECT FROM pg_stat_activity
	WHERE backend_xid = xid($1::xid8) AND state LIKE 'idle in transaction%')`

// TerminateQuery ends the backend still idle in transaction $1, which
// aborts it.
const TerminateQuery = `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
				WHERE backend_xid = xid($1::xid8) AND state LIKE 'idle in transaction%'`

// CommitFailed decides what a failed COMMIT means: err itself when the
// server rejected it (the transaction aborted) or when ctx ended before it
// was sent; nil when it committed after all; a retryable error when it
// did not. postgres says whether the server can be asked (through s) and
// xid is the attempt's transaction id. Only an outcome the server cannot
// tell is reported as [ErrAmbiguousCommit].
func (c *Config) CommitFailed(ctx context.Context, err error, postgres bool, xid string, s Server) error {
	if err == ctx.Err() {
		// database/sql rolled the transaction back when ctx ended; COMMIT
		// was never sent.
		return err
	}
	if dberr.SQLState(err) == "25P02" { // lockhooks' COMMIT (pgbegin.CommitGuarded) found the transaction aborted
		return xidError(err)
	}
	if !commitOutcomeUnknown(err) {
		return err // the server rejected COMMIT: the transaction aborted
	}
	switch {
	case !postgres:
		return fmt.Errorf("%w: COMMIT failed with %w and lockhooks can ask only Postgres what became of a transaction; check whether its effects are there before doing it again", ErrAmbiguousCommit, err)
	case !c.CommitCheck:
		return fmt.Errorf("%w: COMMIT failed with %w, and lockhooks.SkipCommitCheck() kept RunInTx from learning the transaction id; check whether its effects are there before doing it again", ErrAmbiguousCommit, err)
	case xid == "":
		// No id was assigned: the transaction ran on a standby, where it
		// could neither write nor notify, so running it again cannot do
		// anything twice.
		return &attemptError{err: fmt.Errorf("lockhooks: COMMIT of a transaction on a standby (which can write nothing) failed: %w", err), beforeWrite: true}
	}
	status, serr := c.resolve(ctx, s, xid)
	switch status {
	case "committed":
		return nil
	case "aborted":
		return &attemptError{err: fmt.Errorf("lockhooks: COMMIT of transaction %s failed with %w; pg_xact_status says it aborted, so it is run again", xid, err), beforeWrite: true}
	}
	return fmt.Errorf("%w: COMMIT of transaction %s failed with %w, and the server could not say whether it committed: %w; check whether its effects are there before doing it again", ErrAmbiguousCommit, xid, err, serr)
}

// commitOutcomeUnknown reports whether a failed COMMIT may have committed:
// the connection broke, or the server reported it is going away (a FATAL
// of classes 08, 57 or 58, or an internal error XX), which can happen
// after the commit record was written. Any other server error is a
// rejection: the transaction aborted.
func commitOutcomeUnknown(err error) bool {
	if s := dberr.SQLState(err); s != "" {
		switch s[:2] {
		case "08", "57", "58", "XX":
			return true
		}
		return false
	}
	if _, ok := dberr.SQLiteCode(err); ok {
		return false
	}
	return true
}

// resolve asks s what became of transaction xid: "committed" or
// "aborted", or "" and why it cannot say. A backend still idle inside the
// transaction never got its COMMIT, and never will (the connection that
// would send it is broken): it is ended, which aborts the transaction,
// rather than waited for until the server notices the broken connection.
func (c *Config) resolve(ctx context.Context, s Server, xid string) (string, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.ResolveTimeout)
	defer cancel()
	wait := 5 * time.Millisecond
	var last error
	terminated := false
	for {
		status, valid, idle, err := s.Status(ctx, xid)
		switch {
		case err == nil && !valid:
			return "", errors.New("pg_xact_status returned NULL: the transaction id is older than the commit log the server keeps")
		case err == nil && status != "in progress":
			return status, nil
		case err == nil && idle && !terminated:
			terminated = true
			err = s.Terminate(ctx, xid)
			if err == nil {
				continue // ask again at once
			}
			last = fmt.Errorf("ending the backend idle in transaction %s without its COMMIT: %w", xid, err)
		case err == nil:
			last = fmt.Errorf("pg_xact_status still said %q after %v", status, c.ResolveTimeout)
		case dberr.SQLState(err) != "" && !strings.HasPrefix(dberr.SQLState(err), "08") && !strings.HasPrefix(dberr.SQLState(err), "57"):
			return "", fmt.Errorf("asking pg_xact_status: %w", err) // e.g. the function does not exist
		default:
			last = fmt.Errorf("asking pg_xact_status: %w", err)
		}
		if Sleep(ctx, wait) != nil {
			return "", last
		}
		wait = min(2*wait, 200*time.Millisecond)
	}
}
