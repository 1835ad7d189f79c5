package identity

import (
	"strconv"
	"strings"
	"time"
)

// Decode reads a backend's identity from its application_name and its
// last statement: the statement's annotation, when it names the same
// connection (or application_name names none), completes what the 63
// bytes of application_name had to leave out. It is nil when neither
// carries an identity.
func Decode(appName, query string) *Holder {
	a, q := ParseAppName(appName), ParseAnnotation(query)
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

// ParseAppName decodes an application_name lockhooks set; nil if it is not
// one.
func ParseAppName(s string) *Holder {
	rest, ok := strings.CutPrefix(s, AppNamePrefix)
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
func parseWho(s string) *Holder {
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
	return &Holder{Process: s[:i], Database: d, Conn: c}
}

// ParseAnnotation decodes the comment lockhooks puts on its own
// statements; nil if query carries none.
func ParseAnnotation(query string) *Holder {
	i := strings.Index(query, AnnotationPrefix)
	if i < 0 {
		return nil
	}
	body := query[i+len(AnnotationPrefix):]
	end := strings.Index(body, "*/")
	if end < 0 {
		return nil // cut by track_activity_query_size
	}
	id := &Holder{}
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
