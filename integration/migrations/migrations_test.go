package migrations

import (
	"context"
	"database/sql"
	"errors"
	"net/url"
	"strings"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/golang-migrate/migrate/v4"
	migratepg "github.com/golang-migrate/migrate/v4/database/postgres"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/lockhooks/lockhooks"
	"github.com/lockhooks/lockhooks/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// twoReplicas opens one fresh database twice through lockhooks+pgx, as two
// replicas of a service would; through pooler (PgBouncer in transaction
// mode) with WithTransactionPooler when it is not nil.
func twoReplicas(t *testing.T, pooler *pgtest.Pooler) [2]*sql.DB {
	t.Helper()
	dsn := pgtest.DSN(t)
	var dbs [2]*sql.DB
	if pooler != nil {
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatal(err)
		}
		dsn = pooler.Reach(t, strings.TrimPrefix(u.Path, "/"))
		for i := range dbs {
			if dbs[i], err = lockhooks.Open("pgx", dsn, lockhooks.WithTransactionPooler()); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { dbs[i].Close() })
		}
		return dbs
	}
	name, err := lockhooks.Register("pgx")
	if err != nil {
		t.Fatal(err)
	}
	for i := range dbs {
		if dbs[i], err = sql.Open(name, dsn); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { dbs[i].Close() })
	}
	return dbs
}

// modes runs fn straight to Postgres (pooler nil) and through each
// PgBouncer of the test matrix in transaction mode (WithTransactionPooler).
func modes(t *testing.T, fn func(t *testing.T, pooler *pgtest.Pooler)) {
	t.Run("direct", func(t *testing.T) { fn(t, nil) })
	pgtest.EachPooler(t, fn)
}

// noAdvisoryLocksLeft fails t if any advisory lock is held.
func noAdvisoryLocksLeft(t *testing.T, db *sql.DB) {
	t.Helper()
	var n int
	if err := db.QueryRow("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d advisory locks left", n)
	}
}

// goose's Postgres session locker (pg_try_advisory_lock on a *sql.Conn,
// pg_advisory_unlock checked) runs unchanged through lockhooks, from two
// replicas at once: exactly one applies the migrations. Also through
// PgBouncer in transaction mode, where goose needs its table locker
// without lockhooks.
func TestGooseSessionLockerThroughLockhooks(t *testing.T) { modes(t, testGoose) }

func testGoose(t *testing.T, pooler *pgtest.Pooler) {
	fsys := fstest.MapFS{
		"00001_accounts.sql": {Data: []byte("-- +goose Up\nCREATE TABLE accounts (id int PRIMARY KEY);\nSELECT pg_sleep(0.3);\n-- +goose Down\nDROP TABLE accounts;\n")},
		"00002_index.sql":    {Data: []byte("-- +goose Up\nCREATE INDEX ON accounts (id);\n-- +goose Down\nSELECT 1;\n")},
	}
	dbs := twoReplicas(t, pooler)
	ctx := context.Background()
	applied := make([]int, len(dbs))
	var wg sync.WaitGroup
	for i, db := range dbs {
		locker, err := lock.NewPostgresSessionLocker(lock.WithLockTimeout(1, 30))
		if err != nil {
			t.Fatal(err)
		}
		p, err := goose.NewProvider(goose.DialectPostgres, db, fsys, goose.WithSessionLocker(locker))
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			res, err := p.Up(ctx)
			if err != nil {
				t.Errorf("replica %d: %v", i, err)
			}
			applied[i] = len(res)
		})
	}
	wg.Wait()
	if applied[0]+applied[1] != 2 || (applied[0] != 0 && applied[1] != 0) {
		t.Errorf("migrations applied per replica: %v, want [2 0] or [0 2]", applied)
	}
	noAdvisoryLocksLeft(t, dbs[0])
}

// golang-migrate's postgres driver (pg_advisory_lock on its own *sql.Conn)
// runs unchanged through lockhooks, from two replicas at once; also through
// PgBouncer in transaction mode.
func TestGolangMigrateThroughLockhooks(t *testing.T) { modes(t, testMigrate) }

func testMigrate(t *testing.T, pooler *pgtest.Pooler) {
	fsys := fstest.MapFS{
		"migrations/1_accounts.up.sql":   {Data: []byte("CREATE TABLE accounts (id int PRIMARY KEY); SELECT pg_sleep(0.3);")},
		"migrations/1_accounts.down.sql": {Data: []byte("DROP TABLE accounts;")},
		"migrations/2_index.up.sql":      {Data: []byte("CREATE INDEX ON accounts (id);")},
		"migrations/2_index.down.sql":    {Data: []byte("SELECT 1;")},
	}
	dbs := twoReplicas(t, pooler)
	results := make([]error, len(dbs))
	ms := make([]*migrate.Migrate, len(dbs))
	var wg sync.WaitGroup
	for i, db := range dbs {
		src, err := iofs.New(fsys, "migrations")
		if err != nil {
			t.Fatal(err)
		}
		drv, err := migratepg.WithInstance(db, &migratepg.Config{})
		if err != nil {
			t.Fatal(err)
		}
		m, err := migrate.NewWithInstance("iofs", src, "postgres", drv)
		if err != nil {
			t.Fatal(err)
		}
		ms[i] = m
		wg.Go(func() { results[i] = m.Up() })
	}
	wg.Wait()
	applied := 0
	for i, err := range results {
		switch {
		case err == nil:
			applied++
		case errors.Is(err, migrate.ErrNoChange):
		default:
			t.Errorf("replica %d: %v", i, err)
		}
	}
	if applied != 1 {
		t.Errorf("%d replicas applied the migrations, want exactly 1 (results %v)", applied, results)
	}
	var version int
	if err := dbs[0].QueryRow("SELECT version FROM schema_migrations").Scan(&version); err != nil || version != 2 {
		t.Errorf("schema version %d (%v), want 2", version, err)
	}
	noAdvisoryLocksLeft(t, dbs[0])
	for _, m := range ms {
		m.Close() // closes its *sql.DB too
	}
}
