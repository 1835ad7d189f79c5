package lockhooks

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// The model of holders and waiters, one per process.
//
// Every lockhooks database (a connector) joins the process's registry when
// it is opened and leaves it at Close. A holder (a connection that holds a
// lock, or is inside a transaction) has one identity, built here and only
// here: its database (pool name), connection number, backend pid, Go call
// site (where it took the lock, or where its transaction began), since
// when, and span context. Errors, the slow-wait log, spans, metrics and
// /debug/locks ask this file who holds what a waiter waits for and only
// format the answer, so a holder is named the same way everywhere, also
// when it is a connection of another *sql.DB of the process (another
// replica of the same service, say).

// What a holder's Site is (holder.SiteKind).
const (
	siteNone  = ""
	siteTook  = "took_lock"         // where it took the lock
	siteBegan = "began_transaction" // where its transaction began
	siteLater = "later_statement"   // where its transaction ran a later statement
)

// holder is one holder of a lock someone waits for: the identity every
// consumer shows (the page's JSON, errors, log lines, span attributes). It
// is a connection of a lockhooks database of this process, with all the
// model knows of it, or of another process, as that process published it
// in what Postgres shows every session (pg_identity.go).
type holder struct {
	Process   string    `json:"process,omitempty"`  // host/pid:nonce of the holder's process, when it is another process
	Database  string    `json:"database,omitempty"` // its database's pool name
	Conn      uint64    `json:"conn"`
	PID       int32     `json:"pid,omitempty"`
	Key       string    `json:"key,omitempty"`       // what it holds that the waiter wants, when known
	Site      string    `json:"site,omitempty"`      // where it took the lock, or where its transaction began
	Since     time.Time `json:"since,omitzero"`      // when it took the lock, or began its transaction
	Statement string    `json:"statement,omitempty"` // the statement holding it (SQLite autocommit), or the backend's last statement
	State     string    `json:"state,omitempty"`     // the backend's state, as pg_stat_activity says
	TraceID   string    `json:"trace_id,omitempty"`  // the trace of the span it took the lock (or began its transaction) in
	SiteKind  string    `json:"site_kind,omitempty"` // what Site is: took_lock | began_transaction | later_statement
	// In a chain of waits on the server (A holds, C waits for A, the
	// waiter waits behind C): 1 blocks the waiter, 2 blocks a backend that
	// does, and so on (0: found in this process's lock tables). A holder
	// that waits itself (C) is queued ahead of the waiter, not the holder
	// at the root: Statement is what it waits in, for WaitSeconds.
	Depth       int     `json:"depth,omitempty"`
	Queued      bool    `json:"queued,omitempty"`
	WaitSeconds float64 `json:"wait_seconds,omitempty"`
	running     bool    // Statement is what holds the lock (an autocommit statement), not the last one
	dbNum       uint64  // another process's number for its database, when it published no pool name
	span        trace.SpanContext
}

// debugHolder is a holder as the debug page's waiters list it: a
// connection of any lockhooks database, here or in another process;
// blocking backends nobody identified are the waiters' Blockers.
type debugHolder = holder

func (h holder) age() time.Duration {
	if h.Since.IsZero() {
		return 0
	}
	return time.Since(h.Since).Round(time.Millisecond)
}

// who is the holder's connection: `connection #3 of "orders" (backend pid
// 812)`, `connection #3 of "orders" in process web-7/4711 (backend pid
// 812)`.
func (h holder) who() string {
	var b strings.Builder
	if h.Conn != 0 {
		fmt.Fprintf(&b, "connection #%d", h.Conn)
	} else {
		b.WriteString("a connection")
	}
	switch {
	case h.Database != "":
		fmt.Fprintf(&b, " of %q", h.Database)
	case h.dbNum != 0:
		fmt.Fprintf(&b, " of database %d", h.dbNum)
	}
	if h.Process != "" {
		b.WriteString(" in process " + h.Process)
	}
	if h.PID != 0 {
		fmt.Fprintf(&b, " (backend pid %d)", h.PID)
	}
	return b.String()
}

// where says where the holder took the lock or is, or "".
func (h holder) where() string {
	switch {
	case h.running && h.Statement != "":
		return fmt.Sprintf("running the statement %.200q", h.Statement)
	case h.SiteKind == siteTook && h.Site != "":
		return "which took it at " + h.Site
	case h.SiteKind == siteBegan && h.Site != "":
		return "in a transaction begun at " + h.Site
	case h.SiteKind == siteLater && h.Site != "":
		return "in a transaction that ran a statement at " + h.Site
	}
	return ""
}

// String names the holder, the one way every message does: who, where it
// took the lock or began its transaction, for how long, and its trace; a
// queued one, what it waits in and for how long.
func (h holder) String() string {
	parts := []string{h.who()}
	if w := h.where(); w != "" {
		parts = append(parts, w)
	}
	if h.Queued {
		s := "waiting"
		if h.WaitSeconds > 0 {
			s += fmt.Sprintf(" %.1fs", h.WaitSeconds)
		}
		if h.Statement != "" {
			s += fmt.Sprintf(" in %.120q", h.Statement)
		}
		return strings.Join(append(parts, s), ", ")
	}
	if !h.Since.IsZero() {
		parts = append(parts, "for "+h.age().String())
	}
	if h.State != "" {
		parts = append(parts, h.State)
	}
	if !h.running && h.Statement != "" {
		parts = append(parts, fmt.Sprintf("last statement %.120q", h.Statement))
	}
	if h.TraceID != "" {
		parts = append(parts, "trace "+h.TraceID)
	}
	return strings.Join(parts, ", ")
}

// logArgs are the holder's attributes in a log line.
func (h holder) logArgs() []any {
	args := []any{"holder", h.String()}
	if h.Process != "" {
		args = append(args, "holder_process", h.Process)
	}
	if h.Database != "" {
		args = append(args, "holder_database", h.Database)
	}
	if h.Conn != 0 {
		args = append(args, "holder_connection", h.Conn)
	}
	if h.PID != 0 {
		args = append(args, "holder_pid", h.PID)
	}
	if h.Site != "" {
		args = append(args, "holder_site", h.Site)
	}
	if !h.Since.IsZero() {
		args = append(args, "holder_age", h.age().String())
	}
	if h.TraceID != "" {
		args = append(args, "holder_trace_id", h.TraceID)
	}
	return args
}

// spanAttrs are the holder's attributes on a wait span (and its link).
func (h holder) spanAttrs() []attribute.KeyValue {
	site := h.Site
	if site == "" && h.running && h.Statement != "" {
		site = "statement " + strconv.Quote(truncate(h.Statement, 120))
	}
	attrs := []attribute.KeyValue{AttrHolderSite.String(site)}
	if !h.Since.IsZero() {
		attrs = append(attrs, AttrHolderSince.String(h.Since.UTC().Format(time.RFC3339Nano)),
			AttrHolderHeldSeconds.Float64(time.Since(h.Since).Round(time.Millisecond).Seconds()))
	}
	if h.PID != 0 {
		attrs = append(attrs, AttrHolderPID.Int64(int64(h.PID)))
	}
	if h.Process != "" {
		attrs = append(attrs, AttrHolderProcess.String(h.Process))
	}
	if h.Database != "" {
		attrs = append(attrs, AttrHolderPool.String(h.Database))
	}
	if h.Conn != 0 {
		attrs = append(attrs, AttrHolderConn.Int64(int64(h.Conn)))
	}
	return attrs
}

// withSpan sets the holder's span context and trace id.
func (h holder) withSpan(span trace.SpanContext) holder {
	h.span = span
	if span.IsValid() {
		h.TraceID = span.TraceID().String()
	}
	return h
}

// same reports whether h and o are the same connection.
func (h holder) same(o holder) bool {
	return h.Conn == o.Conn && h.Database == o.Database && h.Process == o.Process && h.dbNum == o.dbNum
}

// connHolder is the identity of connection oc, without what it holds.
func connHolder(oc *conn) holder {
	if oc == nil {
		return holder{}
	}
	return holder{Database: oc.connector.pool, Conn: oc.id, PID: oc.shownPID()}
}
