package lockhooks

import (
	"database/sql/driver"
	"strings"

	"github.com/lockhooks/lockhooks/internal/pgdriver"
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
		host, port, db = pgdriver.Target(dsn)
	} else {
		host, port, db = pgdriver.ConnectorTarget(inner)
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
