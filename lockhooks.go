package lockhooks

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/lockhooks/lockhooks/internal/sqlscan"
)

// KeepForUpdateComment in a statement's text keeps its FOR UPDATE as
// written, like [KeepForUpdate] does for one call:
//
//	db.QueryContext(ctx, "SELECT … FOR UPDATE /*lockhooks:keep-for-update*/")
//
// Use it for a row you are about to DELETE or whose key you will change.
const KeepForUpdateComment = "/*" + sqlscan.KeepComment + "*/"

// keepForUpdateKey is the context key of KeepForUpdate.
type keepForUpdateKey struct{}

// KeepForUpdate returns a context whose statements keep FOR UPDATE as
// written on Postgres instead of having it rewritten to FOR NO KEY UPDATE.
// Use it for the statements that lock a row you are about to DELETE or whose
// key you will change; FOR NO KEY UPDATE does not exclude the FOR KEY SHARE
// locks of foreign-key checks, FOR UPDATE does.
func KeepForUpdate(ctx context.Context) context.Context {
	return context.WithValue(ctx, keepForUpdateKey{}, true)
}

// statement is what the hooks decided about one statement's text: the text
// to send and what the wrapper must do around it. It is a value, so
// copying it allocates nothing.
type statement struct {
	text     string
	locks    sqlscan.LockInfo  // row-locking clauses found in the text as given
	rowLock  bool              // Postgres row locks: the statement is timed as a lock wait
	rewrote  bool              // FOR UPDATE became FOR NO KEY UPDATE
	facts    stmtFacts         // what sqlscan.Classify found besides locks and advisory
	advisory *sqlscan.Advisory // advisory-lock calls (Postgres), nil if none

	firstTable string // the first table after the outermost FROM (sqlscan.FirstTable), for a classified text with a locking clause
}

// stmtFacts are flags of a statement. They share one field, in the padding
// after rewrote, so that a statement stays 48 bytes (copied from the cache
// in three aligned moves) and fits in the registers of a call (9 words).
type stmtFacts uint8

const (
	// classified: the text went through sqlscan.Classify, and the other
	// facts and firstTable are known; else only text is set (a text
	// without "for" and without "advisory", which intercept passes with
	// two byte searches).
	classified stmtFacts = 1 << iota
	writes               // SQLite: the statement writes (sqlscan.IsWrite)
)

// writes reports whether the statement writes (SQLite): the classified
// fact, or a look at the text of a statement that was not classified.
func (st statement) writes() bool {
	if st.facts&classified != 0 {
		return st.facts&writes != 0
	}
	return sqlscan.IsWrite(st.text)
}

// intercept is the one place where statement text is classified and
// rewritten, for Exec, Query and Prepare alike. Text that can neither hold
// a locking clause (no "for") nor call an advisory-lock function (no
// "advisory") costs two byte searches.
func (c *conn) intercept(ctx context.Context, query string) statement {
	mayLock := sqlscan.MayLock(query)
	mayAdvisory := c.connector.pins != nil && sqlscan.MayAdvisory(query)
	if !mayLock && !mayAdvisory {
		return statement{text: query}
	}
	return c.connector.rewriter.rewrite(ctx, query)
}

// maxCachedStatement is the longest text the rewrite cache keeps; longer
// statements (bulk inserts, generated SQL) are scanned each time.
const maxCachedStatement = 4 << 10

// maxCacheEntries bounds the rewrite cache; when it is full it starts over.
const maxCacheEntries = 1024

// rewriter applies the locking-clause policy of one wrapped database:
// FOR UPDATE -> FOR NO KEY UPDATE on Postgres, locking clauses removed on
// SQLite. It classifies a statement text once (one sqlscan.Classify) and
// caches the result, so a repeated statement costs a map lookup and no
// allocation.
type rewriter struct {
	dialect sqlscan.Dialect
	op      sqlscan.Op

	mu    sync.RWMutex
	cache map[string]statement

	classified atomic.Int64 // texts classified (cache misses and KeepForUpdate statements)
}

func newRewriter(o *options) *rewriter {
	r := &rewriter{cache: make(map[string]statement)}
	switch {
	case o.dialect == SQLite:
		r.dialect, r.op = sqlscan.SQLite, sqlscan.Strip
	case o.keyShareRewrite:
		r.dialect, r.op = sqlscan.Postgres, sqlscan.NoKeyUpdate
	default:
		r.dialect, r.op = sqlscan.Postgres, sqlscan.Inspect
	}
	return r
}

// rewrite returns query as it must be sent, with what it does with locks.
func (r *rewriter) rewrite(ctx context.Context, query string) statement {
	if r.op == sqlscan.NoKeyUpdate && ctx.Value(keepForUpdateKey{}) != nil {
		return r.classify(query, sqlscan.Inspect)
	}
	r.mu.RLock()
	st, ok := r.cache[query]
	r.mu.RUnlock()
	if ok {
		return st
	}
	st = r.classify(query, r.op)
	if len(query) <= maxCachedStatement {
		r.mu.Lock()
		if len(r.cache) >= maxCacheEntries {
			clear(r.cache)
		}
		r.cache[query] = st
		r.mu.Unlock()
	}
	return st
}

// classify finds, in one pass over query, the text to send (op applied)
// and every fact the connection acts on.
func (r *rewriter) classify(query string, op sqlscan.Op) statement {
	r.classified.Add(1)
	cl := sqlscan.Classify(query, r.dialect, op)
	st := statement{
		text:       cl.Text,
		locks:      cl.Locks,
		rowLock:    r.dialect == sqlscan.Postgres && cl.Locks.Locks(),
		rewrote:    cl.Text != query && op == sqlscan.NoKeyUpdate,
		advisory:   cl.Advisory,
		facts:      classified,
		firstTable: cl.FirstTable,
	}
	if cl.Write {
		st.facts |= writes
	}
	return st
}

// explain adds what to do to errors a locking clause caused; other errors
// are returned as they are.
func (st statement) explain(err error) error {
	if err == nil || !st.locks.Locks() {
		return err
	}
	var pg interface{ SQLState() string }
	if !errors.As(err, &pg) || pg.SQLState() != "0A000" || !strings.Contains(err.Error(), "nullable side of an outer join") {
		return err
	}
	strength := "FOR NO KEY UPDATE"
	if st.locks&sqlscan.Kept != 0 || !strings.Contains(st.text, "NO KEY ") {
		strength = "FOR UPDATE"
	}
	of := st.firstTable // a statement with a locking clause was classified
	if of == "" {
		of = "<table>"
	}
	return &OuterJoinLockError{Err: err, Fix: strength + " OF " + of}
}

// OuterJoinLockError is returned for Postgres's "FOR UPDATE cannot be
// applied to the nullable side of an outer join" (SQLSTATE 0A000): a
// locking clause without OF tries to lock the rows of every table in the
// query, including outer-joined ones that may be NULL. It wraps the
// driver's error.
type OuterJoinLockError struct {
	Err error  // the driver's error
	Fix string // the locking clause to use instead, e.g. FOR NO KEY UPDATE OF runs
}

func (e *OuterJoinLockError) Error() string {
	return fmt.Sprintf("%v; lockhooks: lock only the rows of the table you mean with %s (or load the joined rows with a second query)", e.Err, e.Fix)
}

// Unwrap returns the driver's error.
func (e *OuterJoinLockError) Unwrap() error { return e.Err }
