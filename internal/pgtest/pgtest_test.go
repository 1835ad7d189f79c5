package pgtest

import (
	"context"
	"database/sql"
	"testing"
)

func TestMain(m *testing.M) { Main(m) }

func TestDSNGivesAFreshDatabase(t *testing.T) {
	for i := 0; i < 2; i++ {
		dsn := DSN(t)
		db, err := sql.Open("pgx", dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		var name string
		var tables int
		if err := db.QueryRowContext(context.Background(),
			"SELECT current_database(), (SELECT count(*) FROM pg_tables WHERE schemaname = 'public')").Scan(&name, &tables); err != nil {
			t.Fatal(err)
		}
		if tables != 0 {
			t.Errorf("database %s has %d tables, want a fresh one", name, tables)
		}
		if _, err := db.Exec("CREATE TABLE x (id int)"); err != nil {
			t.Fatal(err)
		}
	}
}

func TestWithDatabase(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://u@h:5/postgres?sslmode=disable": "postgres://u@h:5/db1?sslmode=disable",
		"host=h port=5 user=u":                      "host=h port=5 user=u dbname=db1",
	} {
		if got := withDatabase(in, "db1"); got != want {
			t.Errorf("withDatabase(%q) = %q, want %q", in, got, want)
		}
	}
}
