package lockhooks

import (
	"context"
	"database/sql"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/lockhooks/lockhooks/internal/pgtest"
	"github.com/lockhooks/lockhooks/internal/telemetry"
)

// The default pool name: host, port and database of a Postgres DSN in
// either form, or of a pgx connector; the file of an SQLite DSN; never a
// user or a password.
func TestDefaultPoolName(t *testing.T) {
	for _, c := range []struct {
		d    Dialect
		dsn  string
		want string
	}{
		{Postgres, "postgres://app:s3cret@db.example:5433/orders?sslmode=disable", "db.example:5433/orders"},
		{Postgres, "postgresql://app@db.example/orders", "db.example/orders"},
		{Postgres, "postgres:///orders?host=/var/run/postgresql&password=s3cret", "/var/run/postgresql/orders"},
		{Postgres, "postgres://app:s3cret@h1:5432,h2:5432/orders", "h1:5432,h2:5432/orders"},
		{Postgres, "host=db.example port=5433 user=app password='s3 cret' dbname='my db'", "db.example:5433/my db"},
		{Postgres, "user=app password=s3cret", "postgresql"},
		{SQLite, "file:/data/app.db?_pragma=busy_timeout(5000)", "/data/app.db"},
		{SQLite, "app.db", "app.db"},
	} {
		got := defaultPoolName(c.d, c.dsn, nil)
		if got != c.want || strings.Contains(got, "s3cret") || strings.Contains(got, "app@") {
			t.Errorf("defaultPoolName(%q) = %q, want %q", c.dsn, got, c.want)
		}
	}
	cfg, err := pgx.ParseConfig("postgres://app:s3cret@db.example:5433/orders")
	if err != nil {
		t.Fatal(err)
	}
	if got := defaultPoolName(Postgres, "", stdlib.GetConnector(*cfg)); got != "db.example:5433/orders" {
		t.Errorf("the pool name of a pgx connector: %q", got)
	}
}

// Two databases on one MeterProvider: every observation carries its
// database's pool name, and the gauges of one (a parked session lock) are
// not overwritten by the other's zeros.
func TestGaugesPerDatabase(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	dsn := pgtest.DSN(t)
	open := func(opts ...Option) *sql.DB {
		db, err := Open("pgx", dsn, append(opts, WithMeterProvider(mp))...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return db
	}
	a, b := open(WithPoolName("jobs-a")), open() // the second has the default name
	pb := connectorOf(t, b).Pool
	if pb == "jobs-a" || pb == "" || connectorOf(t, a).Pool != "jobs-a" {
		t.Fatalf("pool names: %q and %q", connectorOf(t, a).Pool, pb)
	}
	ctx := context.Background()
	sc, err := a.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sc.ExecContext(ctx, "SELECT pg_advisory_lock(31)"); err != nil {
		t.Fatal(err)
	}
	sc.Close() // parked
	for _, name := range []string{"lockhooks.advisory.held_locks", "lockhooks.advisory.parked_connections"} {
		got := gaugeByPool(t, reader, name)
		if got["jobs-a"] != 1 || got[pb] != 0 || len(got) != 2 {
			t.Errorf("%s by pool: %v, want 1 for jobs-a and 0 for %s", name, got, pb)
		}
	}
	// A histogram point carries the pool name too.
	mustExec(t, b, "SELECT pg_advisory_lock(32)")
	mustExec(t, b, "SELECT pg_advisory_unlock(32)")
	m, ok := collect(t, reader, "lockhooks.lock.wait.duration")
	if !ok {
		t.Fatal("no wait histogram")
	}
	pools := map[string]uint64{}
	for _, dp := range m.Data.(metricdata.Histogram[float64]).DataPoints {
		pool, _ := dp.Attributes.Value(telemetry.AttrPoolName)
		pools[pool.AsString()] += dp.Count
	}
	if pools["jobs-a"] != 1 || pools[pb] != 1 || len(pools) != 2 {
		t.Errorf("waits by pool: %v, want one for each database", pools)
	}
}

// gaugeByPool returns an Int64 gauge's value per pool name.
func gaugeByPool(t *testing.T, r *sdkmetric.ManualReader, name string) map[string]int64 {
	t.Helper()
	m, ok := collect(t, r, name)
	if !ok {
		t.Fatalf("no metric %s", name)
	}
	out := map[string]int64{}
	for _, dp := range m.Data.(metricdata.Gauge[int64]).DataPoints {
		pool, _ := dp.Attributes.Value(telemetry.AttrPoolName)
		out[pool.AsString()] += dp.Value
	}
	return out
}
