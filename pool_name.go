package lockhooks

import (
	"database/sql/driver"
	"net/url"
	"reflect"
	"strconv"
	"strings"

	"github.com/lockhooks/lockhooks/internal/sqlitelock"
)

// WithPoolName names the database's connection pool: the attribute
// db.client.connection.pool.name (OpenTelemetry's) on every metric
// observation of this database, and the database a holder belongs to in
// errors, log lines, spans and /debug/locks. Give each *sql.DB of a
// process its own name, for example "orders-primary" and "orders-replica".
//
// The default is derived from the DSN, never from its user or password:
// "host:port/dbname" on Postgres (as the DSN writes them; the host and the
// database of a pgx stdlib connector), the file path on SQLite, or
// "postgresql" / "sqlite" when neither can be read. A default that another
// open database of the process already has gets a suffix, "#2", "#3", in
// the order the databases were opened, so two *sql.DB on one DSN never
// share their gauges.
func WithPoolName(name string) Option {
	return func(o *options) { o.poolName = name }
}

// defaultPoolName is the pool name of a database opened without
// WithPoolName: see WithPoolName.
func defaultPoolName(d Dialect, dsn string, inner driver.Connector) string {
	if d == SQLite {
		if dsn == "" {
			dsn, _ = sqlitelock.ModerncConnectorDSN(inner)
		}
		if name := sqlitePoolName(dsn); name != "" {
			return name
		}
		return "sqlite"
	}
	host, port, db := "", "", ""
	if dsn != "" {
		host, port, db = parsePostgresDSN(dsn)
	} else {
		host, port, db = connectorTarget(inner)
	}
	if host == "" && db == "" {
		return "postgresql"
	}
	name := host
	if port != "" {
		name += ":" + port
	}
	if db != "" {
		name += "/" + db
	}
	return name
}

// sqlitePoolName is the file of an SQLite DSN, without its parameters.
func sqlitePoolName(dsn string) string {
	name := strings.TrimPrefix(dsn, "file:")
	if i := strings.IndexByte(name, '?'); i >= 0 {
		name = name[:i]
	}
	return name
}

// parsePostgresDSN reads the host, port and database of a libpq DSN: a
// URL (postgres://user:password@host:port/db?…) or key=value pairs.
// Nothing else is read.
func parsePostgresDSN(dsn string) (host, port, db string) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", "", ""
		}
		host, port = u.Hostname(), u.Port()
		if strings.Contains(u.Host, ",") { // several hosts: keep them as written
			host, port = u.Host, ""
		}
		db = strings.TrimPrefix(u.Path, "/")
		q := u.Query()
		if host == "" {
			host = q.Get("host")
		}
		if port == "" {
			port = q.Get("port")
		}
		if db == "" {
			db = q.Get("dbname")
		}
		return host, port, db
	}
	for _, kv := range splitKeyValues(dsn) {
		switch kv[0] {
		case "host":
			host = kv[1]
		case "port":
			port = kv[1]
		case "dbname":
			db = kv[1]
		}
	}
	return host, port, db
}

// splitKeyValues splits a key=value DSN (values may be single-quoted, with
// backslash escapes).
func splitKeyValues(s string) [][2]string {
	var out [][2]string
	for {
		s = strings.TrimLeft(s, " \t\n\r")
		eq := strings.IndexByte(s, '=')
		if eq <= 0 {
			return out
		}
		key := strings.TrimSpace(s[:eq])
		s = strings.TrimLeft(s[eq+1:], " \t")
		var val strings.Builder
		if strings.HasPrefix(s, "'") {
			s = s[1:]
			for len(s) > 0 && s[0] != '\'' {
				if s[0] == '\\' && len(s) > 1 {
					s = s[1:]
				}
				val.WriteByte(s[0])
				s = s[1:]
			}
			if len(s) > 0 {
				s = s[1:]
			}
		} else {
			end := strings.IndexAny(s, " \t\n\r")
			if end < 0 {
				end = len(s)
			}
			val.WriteString(s[:end])
			s = s[end:]
		}
		out = append(out, [2]string{key, val.String()})
	}
}

// connectorTarget reads the host, port and database of a connector whose
// configuration has exported Host, Port and Database fields (pgx stdlib's
// connector embeds pgx.ConnConfig), without importing its driver.
func connectorTarget(c driver.Connector) (host, port, db string) {
	v := reflect.ValueOf(c)
	for v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface {
		if v.IsNil() {
			return "", "", ""
		}
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct {
		return "", "", ""
	}
	field := func(name string) reflect.Value {
		f, ok := v.Type().FieldByName(name)
		if !ok || !f.IsExported() {
			return reflect.Value{}
		}
		x, err := v.FieldByIndexErr(f.Index)
		if err != nil {
			return reflect.Value{}
		}
		return x
	}
	if f := field("Host"); f.Kind() == reflect.String {
		host = f.String()
	}
	if f := field("Port"); f.CanUint() && f.Uint() != 0 {
		port = strconv.FormatUint(f.Uint(), 10)
	}
	if f := field("Database"); f.Kind() == reflect.String {
		db = f.String()
	}
	return host, port, db
}
