package lockhooks

import (
	"crypto/rand"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// A holder's identity across processes (Postgres).
//
// While a connection holds session advisory locks or is inside a
// transaction, another process running lockhooks can read who it is from
// what Postgres shows every session in pg_stat_activity, without any schema
// object:
//
//   - application_name (at most 63 bytes), set by lockhooks only on
//     connections whose application_name is empty (the user's configuration
//     is law: a DSN, PGAPPNAME or SET that names the application turns it
//     off), in a compact form:
//
//     lockhooks <host>/<pid>#<database>.<connection> tx <site>
//     lockhooks <host>/<pid>#<database>.<connection> lock <site> @<since>
//
//     "tx" is a transaction begun at site (its age is pg_stat_activity's
//     xact_start); "lock" a session advisory lock taken at site, since
//     <since> (Unix milliseconds in base 36), then " %<pool>" when the
//     database has a pool name. A long site keeps its end; what does not
//     fit is left out (the trace never fits: only the annotation has it).
//   - lockhooks' own statements on a holder (the pg_locks read after a lock
//     statement, a transaction-pooler holder's statements) begin with a
//     comment that names the holder in full:
//
//     /*lockhooks holder: process=<host>/<pid> db=<n> conn=<n> holds=<…>
//     site=<file:line> since=<RFC 3339> trace=<trace id>-<span id>*/
//
//     so the last statement another process sees for a parked connection
//     says whose it is instead of looking like application code.
//
// Both are written only into statements that run anyway (see
// pg_identity_publish.go) and decoded by the waiters' blocker reads (see
// pg_identity_blockers.go).

// appNamePrefix starts every application_name lockhooks sets.
const appNamePrefix = "lockhooks "

// appNameProcessLen bounds the process label in application_name.
const appNameProcessLen = 20

// maxAppName is Postgres's limit (NAMEDATALEN - 1); longer values are
// truncated by the server.
const maxAppName = 63

// annotationPrefix starts the comment on lockhooks' own statements.
const annotationPrefix = "/*lockhooks holder: "

// holderIdentity is who a Postgres backend is, as lockhooks published it:
// the process, database and connection, and what it holds since when,
// taken where, in which trace.
type holderIdentity struct {
	Process  string    `json:"process"`            // host/pid:nonce (processLabel)
	Database uint64    `json:"database,omitempty"` // the lockhooks database's number in its process
	Pool     string    `json:"pool,omitempty"`     // the database's pool name, when it has one
	Conn     uint64    `json:"conn"`               // the connection's number in its database
	Holds    string    `json:"holds,omitempty"`    // "tx" (a transaction), or "lock" plus the keys of a session lock
	Site     string    `json:"site,omitempty"`     // where the transaction began or the lock was taken
	Since    time.Time `json:"since,omitzero"`     // when the lock was taken (transactions: pg_stat_activity's xact_start)
	TraceID  string    `json:"trace_id,omitempty"` // hex
	SpanID   string    `json:"span_id,omitempty"`  // hex
}

// spanContext is the holder's span as a remote span context, for a link.
func (id *holderIdentity) spanContext() trace.SpanContext {
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

// holder is the identity as a holder of the model (holders.go): the
// process, database and connection it names, where and since when it took
// its session lock, or where its transaction began (whose start the
// server's xact_start says), and its trace.
func (id *holderIdentity) holder() holder {
	h := holder{Process: id.Process, Database: id.Pool, Conn: id.Conn, Site: id.Site, TraceID: id.TraceID, span: id.spanContext()}
	if id.Pool == "" {
		h.dbNum = id.Database
	}
	switch {
	case id.Holds == "tx":
		h.SiteKind = siteBegan
	case strings.HasPrefix(id.Holds, "lock"):
		h.SiteKind, h.Since = siteTook, id.Since
		if k, ok := parseKeyToken(strings.TrimSpace(strings.TrimPrefix(id.Holds, "lock"))); ok {
			h.Key = k.String()
		}
	}
	if h.Site == "" {
		h.SiteKind = siteNone
	}
	return h
}

// parseKeyToken reads a key as keyToken writes it: 42, 1/2, 42-shared.
func parseKeyToken(s string) (lockKey, bool) {
	var k lockKey
	s, k.shared = strings.CutSuffix(s, "-shared")
	a, b, pair := strings.Cut(s, "/")
	k1, err := strconv.ParseInt(a, 10, 64)
	if err != nil {
		return lockKey{}, false
	}
	k.k1 = k1
	if pair {
		k2, err := strconv.ParseInt(b, 10, 64)
		if err != nil {
			return lockKey{}, false
		}
		k.pair, k.k2 = true, k2
	}
	return k, true
}

// ofThisProcess reports whether the identity is one this process published
// (application_name shortens the process label).
func (id *holderIdentity) ofThisProcess() bool {
	return id.Process == processLabel() || id.Process == shortProcess(processLabel(), appNameProcessLen)
}

// processLabel is this process as other processes see it: host/pid:nonce.
// Host and pid alone do not tell processes apart: two containers of one
// pod share the host name and both run as pid 1, and a restarted container
// is labelled like its predecessor, whose backends may outlive it (a
// leaked lock held until TCP keepalive ends them); four random base-36
// characters, drawn once per process, do.
var processLabel = sync.OnceValue(func() string {
	host, _ := os.Hostname()
	host = safeToken(host, "-")
	if host == "" {
		host = "localhost"
	}
	var b [4]byte
	rand.Read(b[:])
	const digits = "0123456789abcdefghijklmnopqrstuvwxyz"
	nonce := make([]byte, len(b))
	for i, x := range b {
		nonce[i] = digits[int(x)%len(digits)]
	}
	return host + "/" + strconv.Itoa(os.Getpid()) + ":" + string(nonce)
})

// safeToken keeps the characters an identity may carry unquoted in a SQL
// string literal, a comment and a space-separated list: letters, digits and
// ._-/:@+~, and replaces the others with repl.
func safeToken(s, repl string) string {
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

// shortProcess fits a process label into n bytes for application_name:
// a long host keeps its start and its end (a Kubernetes pod's unique
// suffix), joined by "~".
func shortProcess(p string, n int) string {
	if len(p) <= n {
		return p
	}
	host, pid, _ := strings.Cut(p, "/")
	keep := n - len(pid) - 2 // "~" and "/"
	if keep < 4 {
		return p[:n]
	}
	tail := min(6, keep/2)
	return host[:keep-tail] + "~" + host[len(host)-tail:] + "/" + pid
}

// appName is the compact identity for application_name, at most
// maxAppName bytes: the site first (a long one loses its directory, then
// its start),
// then the time a session lock was taken and the pool, as room allows. The
// trace (50 bytes in hex) never fits: only the annotation carries it.
func (id *holderIdentity) appName() string {
	var buf [2 * maxAppName]byte
	return string(id.appendAppName(buf[:0]))
}

// appendAppName appends appName's value to b.
func (id *holderIdentity) appendAppName(b []byte) []byte {
	start := len(b)
	b = append(b, appNamePrefix...)
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

// minAppNameSite is the shortest site worth writing ("~" and a file:line).
const minAppNameSite = 12

// appendSinceField appends the time a session lock was taken, as
// application_name carries it ("@" and Unix milliseconds in base 36), to b.
func appendSinceField(b []byte, id *holderIdentity) []byte {
	if id.Since.IsZero() || id.Holds == "tx" {
		return b
	}
	return strconv.AppendInt(append(b, '@'), id.Since.UnixMilli(), 36)
}

// annotation is the comment that begins lockhooks' own statements on a
// holder: every field, no length limit. It holds only safeToken
// characters, so it can never end the comment early.
func (id *holderIdentity) annotation() string {
	var buf [256]byte
	return string(id.appendAnnotation(buf[:0]))
}

// appendAnnotation appends the annotation to b.
func (id *holderIdentity) appendAnnotation(b []byte) []byte {
	b = append(b, annotationPrefix...)
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

// parseAppName decodes an application_name lockhooks set; nil if it is not
// one.
func parseAppName(s string) *holderIdentity {
	rest, ok := strings.CutPrefix(s, appNamePrefix)
	if !ok {
		return nil
	}
	fields := strings.Fields(rest)
	if len(fields) == 0 {
		return nil
	}
	id := parseWho(fields[0])
	if id == nil {
		return nil
	}
	for i := 1; i < len(fields); i++ {
		f := fields[i]
		switch {
		case f == "tx" || f == "lock":
			id.Holds = f
		case strings.HasPrefix(f, "@"):
			if ms, err := strconv.ParseInt(f[1:], 36, 64); err == nil {
				id.Since = time.UnixMilli(ms)
			}
		case strings.HasPrefix(f, "%"):
			id.Pool = f[1:]
		default:
			id.Site = f
		}
	}
	return id
}

// parseWho decodes "<host>/<pid>#<database>.<connection>".
func parseWho(s string) *holderIdentity {
	i := strings.LastIndexByte(s, '#')
	if i <= 0 {
		return nil
	}
	db, conn, ok := strings.Cut(s[i+1:], ".")
	if !ok {
		return nil
	}
	d, err1 := strconv.ParseUint(db, 10, 64)
	c, err2 := strconv.ParseUint(conn, 10, 64)
	if err1 != nil || err2 != nil {
		return nil
	}
	return &holderIdentity{Process: s[:i], Database: d, Conn: c}
}

// parseAnnotation decodes the comment lockhooks puts on its own
// statements; nil if query carries none.
func parseAnnotation(query string) *holderIdentity {
	i := strings.Index(query, annotationPrefix)
	if i < 0 {
		return nil
	}
	body := query[i+len(annotationPrefix):]
	end := strings.Index(body, "*/")
	if end < 0 {
		return nil // cut by track_activity_query_size
	}
	id := &holderIdentity{}
	for _, f := range strings.Fields(body[:end]) {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			continue
		}
		switch k {
		case "process":
			id.Process = v
		case "db":
			id.Database, _ = strconv.ParseUint(v, 10, 64)
		case "pool":
			id.Pool = v
		case "conn":
			id.Conn, _ = strconv.ParseUint(v, 10, 64)
		case "holds":
			id.Holds = strings.ReplaceAll(v, ":", " ")
		case "site":
			id.Site = v
		case "since":
			id.Since, _ = time.Parse("2006-01-02T15:04:05.000Z", v)
		case "trace":
			id.TraceID, id.SpanID, _ = strings.Cut(v, "-")
		}
	}
	if id.Process == "" || id.Conn == 0 {
		return nil
	}
	return id
}

// decodeIdentity reads a backend's identity from its application_name and
// its last statement: the statement's annotation, when it names the same
// connection (or application_name names none), completes what the 63
// bytes of application_name had to leave out.
func decodeIdentity(appName, query string) *holderIdentity {
	a, q := parseAppName(appName), parseAnnotation(query)
	switch {
	case a == nil:
		return q
	case q == nil || shortProcess(q.Process, appNameProcessLen) != a.Process || q.Database != a.Database || q.Conn != a.Conn:
		return a
	}
	if a.Holds == "tx" && strings.HasPrefix(q.Holds, "lock") {
		// In a transaction now; the statement is from before it.
		return a
	}
	return q
}

// traceIDs returns the hex trace and span ids of sc, or "" when it is not
// valid.
func traceIDs(sc trace.SpanContext) (string, string) {
	if !sc.IsValid() {
		return "", ""
	}
	return sc.TraceID().String(), sc.SpanID().String()
}
