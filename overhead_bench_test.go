package lockhooks

import (
	"context"
	"database/sql/driver"
	"testing"

	"github.com/lockhooks/lockhooks/internal/sqlitelock"
)

// BenchmarkWrapperOverhead is lockhooks' own cost per statement, measured
// apart from any database and from database/sql: the same ExecContext and
// QueryContext on a driver connection that does nothing (the fake driver),
// called directly (driver=raw) and through lockhooks' wrapped connection
// (driver=lockhooks), Postgres dialect. The difference is what lockhooks
// adds to a statement on a real server, where a loopback round trip costs
// 100–200 µs on this machine (see "Wrapper overhead per statement").
func BenchmarkWrapperOverhead(b *testing.B) {
	for _, q := range []struct{ name, text string }{
		{"stmt=plain", "UPDATE t SET v = v + 1 WHERE id = $1"},
		{"stmt=for-update", "SELECT v FROM t WHERE id = $1 FOR UPDATE"},
	} {
		fc := newFakeConn()
		fc.quiet = true
		fc.rows = func() driver.Rows { return (*fakeRows)(nil) }
		wrapped := newConn(newConnector(fakeConnector{}, &Driver{}, mustOptions(b, WithDialect(Postgres)), "", sqlitelock.DSN{}), fc)
		for _, c := range []struct {
			name string
			conn driver.Conn
		}{{"driver=raw", fc}, {"driver=lockhooks", wrapped}} {
			b.Run(q.name+"/op=exec/"+c.name, func(b *testing.B) {
				exec, ctx := c.conn.(driver.ExecerContext), context.Background()
				for b.Loop() {
					exec.ExecContext(ctx, q.text, nil)
				}
			})
			b.Run(q.name+"/op=query/"+c.name, func(b *testing.B) {
				query, ctx := c.conn.(driver.QueryerContext), context.Background()
				for b.Loop() {
					if rows, err := query.QueryContext(ctx, q.text, nil); err == nil {
						rows.Close()
					}
				}
			})
		}
	}
}
