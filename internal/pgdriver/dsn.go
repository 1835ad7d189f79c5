package pgdriver

import (
	"database/sql/driver"
	"net/url"
	"reflect"
	"strconv"
	"strings"
)

// Target reads the host, port and database of a libpq DSN, as written: a
// URL (postgres://user:password@host:port/db?…) or key=value pairs. Nothing
// else is read (never the user or the password); what is absent is "".
func Target(dsn string) (host, port, db string) {
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
	for _, kv := range KeyValues(dsn) {
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

// KeyValues splits a key=value DSN into its pairs, in order (values may be
// single-quoted, with backslash escapes).
func KeyValues(s string) [][2]string {
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

// ConnectorTarget reads the host, port and database of a connector whose
// configuration has exported Host, Port and Database fields (pgx stdlib's
// connector embeds pgx.ConnConfig), by reflection; "" where it has none.
func ConnectorTarget(c driver.Connector) (host, port, db string) {
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
