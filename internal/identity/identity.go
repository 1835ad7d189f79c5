package identity

import (
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// AppNamePrefix starts every application_name lockhooks sets.
const AppNamePrefix = "lockhooks "

// AnnotationPrefix starts the comment on lockhooks' own statements.
const AnnotationPrefix = "/*lockhooks holder: "

// appNameProcessLen bounds the process label in application_name.
const appNameProcessLen = 20

// maxAppName is Postgres's limit (NAMEDATALEN - 1); longer values are
// truncated by the server.
const maxAppName = 63

// minAppNameSite is the shortest site worth writing ("~" and a file:line).
const minAppNameSite = 12

// Holder is who a Postgres backend is, as lockhooks published it: the
// process, database and connection, and what it holds since when, taken
// where, in which trace.
type Holder struct {
	Process  string    `json:"process"`            // host/pid:nonce (ProcessLabel)
	Database uint64    `json:"database,omitempty"` // the lockhooks database's number in its process
	Pool     string    `json:"pool,omitempty"`     // the database's pool name, when it has one
	Conn     uint64    `json:"conn"`               // the connection's number in its database
	Holds    string    `json:"holds,omitempty"`    // "tx" (a transaction), or "lock" plus the keys of a session lock
	Site     string    `json:"site,omitempty"`     // where the transaction began or the lock was taken
	Since    time.Time `json:"since,omitzero"`     // when the lock was taken (transactions: pg_stat_activity's xact_start)
	TraceID  string    `json:"trace_id,omitempty"` // hex
	SpanID   string    `json:"span_id,omitempty"`  // hex
}

// SpanContext is the holder's span as a remote span context, for a link.
func (id *Holder) SpanContext() trace.SpanContext {
	if id == nil {
		return trace.SpanContext{}
	}
	tid, err1 := trace.TraceIDFromHex(id.TraceID)
	sid, err2 := trace.SpanIDFromHex(id.SpanID)
	if err1 != nil || err2 != nil {
		return trace.SpanContext{}
	}
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, Remote: true})
}

// TraceIDs returns the hex trace and span ids of sc, or "" when it is not
// valid.
func TraceIDs(sc trace.SpanContext) (string, string) {
	if !sc.IsValid() {
		return "", ""
	}
	return sc.TraceID().String(), sc.SpanID().String()
}

// OfThisProcess reports whether the identity is one this process published
// (application_name shortens the process label).
func (id *Holder) OfThisProcess() bool {
	return id.Process == ProcessLabel() || id.Process == shortProcess(ProcessLabel(), appNameProcessLen)
}

// AppName is the compact identity for application_name, at most 63
// bytes: the site first (a long one loses its directory, then its start),
// then the time a session lock was taken and the pool, as room allows. The
// trace (50 bytes in hex) never fits: only the annotation carries it.
func (id *Holder) AppName() string {
	var buf [2 * maxAppName]byte
	return string(id.AppendAppName(buf[:0]))
}

// AppendAppName appends AppName's value to b.
func (id *Holder) AppendAppName(b []byte) []byte {
	start := len(b)
	b = append(b, AppNamePrefix...)
	b = append(b, shortProcess(id.Process, appNameProcessLen)...)
	b = append(b, '#')
	b = strconv.AppendUint(b, id.Database, 10)
	b = append(b, '.')
	b = strconv.AppendUint(b, id.Conn, 10)
	if len(b)-start > maxAppName {
		return b[:start+maxAppName]
	}
	kind, _, _ := strings.Cut(id.Holds, " ") // "lock 42" -> "lock": the keys are in the annotation
	if kind == "" {
		return b
	}
	b = append(b, ' ')
	b = append(b, kind...)
	var sinceBuf [16]byte
	since := appendSinceField(sinceBuf[:0], id)
	if id.Site != "" {
		room := maxAppName - (len(b) - start) - 1
		if len(since) > 0 && (len(id.Site) <= room-1-len(since) || room-1-len(since) >= minAppNameSite) {
			room -= 1 + len(since) // the time fits too
		}
		site := id.Site
		if len(site) > room {
			if i := strings.LastIndexByte(site, '/'); i >= 0 {
				site = site[i+1:] // file:line, without its directory
			}
		}
		switch {
		case len(site) <= room:
			b = append(b, ' ')
			b = append(b, site...)
		case room >= minAppNameSite:
			b = append(b, " ~"...)
			b = append(b, id.Site[len(id.Site)-room+1:]...)
		}
	}
	if len(since) > 0 && len(b)-start+1+len(since) <= maxAppName {
		b = append(b, ' ')
		b = append(b, since...)
	}
	if id.Pool != "" && len(b)-start+2+len(id.Pool) <= maxAppName {
		b = append(b, " %"...)
		b = append(b, id.Pool...)
	}
	if len(b)-start > maxAppName {
		// A decoded identity's fields are whatever another session showed
		// (a kind of any length, numbers of 20 digits): the bound holds
		// whatever they are.
		b = b[:start+maxAppName]
	}
	return b
}

// appendSinceField appends the time a session lock was taken, as
// application_name carries it ("@" and Unix milliseconds in base 36), to b.
func appendSinceField(b []byte, id *Holder) []byte {
	if id.Since.IsZero() || id.Holds == "tx" {
		return b
	}
	return strconv.AppendInt(append(b, '@'), id.Since.UnixMilli(), 36)
}

// Annotation is the comment that begins lockhooks' own statements on a
// holder: every field, no length limit. It holds only SafeToken
// characters, so it can never end the comment early.
func (id *Holder) Annotation() string {
	var buf [256]byte
	return string(id.AppendAnnotation(buf[:0]))
}

// AppendAnnotation appends the annotation to b.
func (id *Holder) AppendAnnotation(b []byte) []byte {
	b = append(b, AnnotationPrefix...)
	b = append(b, "process="...)
	b = append(b, id.Process...)
	b = append(b, " db="...)
	b = strconv.AppendUint(b, id.Database, 10)
	if id.Pool != "" {
		b = append(b, " pool="...)
		b = append(b, id.Pool...)
	}
	b = append(b, " conn="...)
	b = strconv.AppendUint(b, id.Conn, 10)
	if id.Holds != "" {
		b = append(b, " holds="...)
		for i := range len(id.Holds) {
			if ch := id.Holds[i]; ch == ' ' {
				b = append(b, ':')
			} else {
				b = append(b, ch)
			}
		}
	}
	if id.Site != "" {
		b = append(b, " site="...)
		b = append(b, id.Site...)
	}
	if !id.Since.IsZero() {
		b = append(b, " since="...)
		b = id.Since.UTC().AppendFormat(b, "2006-01-02T15:04:05.000Z")
	}
	if id.TraceID != "" {
		b = append(b, " trace="...)
		b = append(b, id.TraceID...)
		b = append(b, '-')
		b = append(b, id.SpanID...)
	}
	return append(b, "*/ "...)
}

// SafeToken keeps the characters an identity may carry unquoted in a SQL
// string literal, a comment and a space-separated list: letters, digits and
// ._-/:@+~, and replaces the others with repl.
func SafeToken(s, repl string) string {
	ok := func(r rune) bool {
		return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("._-/:@+~", r)
	}
	clean := true
	for _, r := range s {
		if !ok(r) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if ok(r) {
			b.WriteRune(r)
		} else {
			b.WriteString(repl)
		}
	}
	return b.String()
}
