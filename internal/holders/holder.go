package holders

import (
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// What a holder's Site is (Holder.SiteKind).
const (
	SiteNone  = ""
	SiteTook  = "took_lock"         // where it took the lock
	SiteBegan = "began_transaction" // where its transaction began
	SiteLater = "later_statement"   // where its transaction ran a later statement
)

// Holder is one holder of a lock someone waits for: the identity every
// consumer shows (the page's JSON, errors, log lines, span attributes). It
// is a connection of a lockhooks database of this process, with all the
// model knows of it, or of another process, as that process published it
// in what Postgres shows every session.
type Holder struct {
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
	// Running says Statement is what holds the lock (an autocommit
	// statement), not the last one the holder ran.
	Running bool `json:"-"`
	// DatabaseNumber is another process's number for its database, when
	// it published no pool name.
	DatabaseNumber uint64 `json:"-"`
	// Span is the span context it took the lock (or began its
	// transaction) in; set it with WithSpan, which sets TraceID too.
	Span trace.SpanContext `json:"-"`
}

// age is how long the holder has held the lock, or 0 when not known.
func (h Holder) age() time.Duration {
	if h.Since.IsZero() {
		return 0
	}
	return time.Since(h.Since).Round(time.Millisecond)
}

// Who is the holder's connection: `connection #3 of "orders" (backend pid
// 812)`, `connection #3 of "orders" in process web-7/4711 (backend pid
// 812)`.
func (h Holder) Who() string {
	var b strings.Builder
	if h.Conn != 0 {
		fmt.Fprintf(&b, "connection #%d", h.Conn)
	} else {
		b.WriteString("a connection")
	}
	switch {
	case h.Database != "":
		fmt.Fprintf(&b, " of %q", h.Database)
	case h.DatabaseNumber != 0:
		fmt.Fprintf(&b, " of database %d", h.DatabaseNumber)
	}
	if h.Process != "" {
		b.WriteString(" in process " + h.Process)
	}
	if h.PID != 0 {
		fmt.Fprintf(&b, " (backend pid %d)", h.PID)
	}
	return b.String()
}

// Where says where the holder took the lock or is, or "".
func (h Holder) Where() string {
	switch {
	case h.Running && h.Statement != "":
		return fmt.Sprintf("running the statement %.200q", h.Statement)
	case h.SiteKind == SiteTook && h.Site != "":
		return "which took it at " + h.Site
	case h.SiteKind == SiteBegan && h.Site != "":
		return "in a transaction begun at " + h.Site
	case h.SiteKind == SiteLater && h.Site != "":
		return "in a transaction that ran a statement at " + h.Site
	}
	return ""
}

// String names the holder, the one way every message does: who, where it
// took the lock or began its transaction, for how long, and its trace; a
// queued one, what it waits in and for how long.
func (h Holder) String() string {
	parts := []string{h.Who()}
	if w := h.Where(); w != "" {
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
	if !h.Running && h.Statement != "" {
		parts = append(parts, fmt.Sprintf("last statement %.120q", h.Statement))
	}
	if h.TraceID != "" {
		parts = append(parts, "trace "+h.TraceID)
	}
	return strings.Join(parts, ", ")
}

// LogArgs are the holder's attributes in a log line, as slog key-value
// pairs: holder (String), then holder_process, holder_database,
// holder_connection, holder_pid, holder_site, holder_age and
// holder_trace_id, each when known.
func (h Holder) LogArgs() []any {
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

// TookLock returns the holder as the holder of lock key (named for a
// reader), which it took at site ("" where not known), at since, in span.
func (h Holder) TookLock(key, site string, since time.Time, span trace.SpanContext) Holder {
	h.Key, h.Site, h.Since, h.SiteKind = key, site, since, SiteTook
	return h.WithSpan(span)
}

// WithSpan returns the holder with its span context, and its trace id
// when span is valid.
func (h Holder) WithSpan(span trace.SpanContext) Holder {
	h.Span = span
	if span.IsValid() {
		h.TraceID = span.TraceID().String()
	}
	return h
}

// SameConnection reports whether h and o are the same connection.
func (h Holder) SameConnection(o Holder) bool {
	return h.Conn == o.Conn && h.Database == o.Database && h.Process == o.Process && h.DatabaseNumber == o.DatabaseNumber
}
