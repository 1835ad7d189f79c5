package stacks

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"entgo.io/ent/dialect"
	entsql "entgo.io/ent/dialect/sql"
	"github.com/jmoiron/sqlx"
	gormpostgres "gorm.io/driver/postgres"
	gormsqlite "gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
	"gorm.io/gorm/logger"

	_ "github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"

	"github.com/lockhooks/lockhooks"
	"github.com/lockhooks/lockhooks/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// dbs is one fresh database of each dialect, opened through lockhooks, and
// a raw Postgres handle to look at what the server ran.
type dbs struct {
	pg, lite, rawPG *sql.DB
}

func open(t *testing.T) dbs {
	t.Helper()
	dsn := pgtest.DSN(t)
	pgName, err := lockhooks.Register("pgx")
	if err != nil {
		t.Fatal(err)
	}
	liteName, err := lockhooks.Register("sqlite")
	if err != nil {
		t.Fatal(err)
	}
	var d dbs
	if d.pg, err = sql.Open(pgName, dsn); err != nil {
		t.Fatal(err)
	}
	if d.lite, err = sql.Open(liteName, filepath.Join(t.TempDir(), "app.db")); err != nil {
		t.Fatal(err)
	}
	if d.rawPG, err = sql.Open("pgx", dsn); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.pg.Close(); d.lite.Close(); d.rawPG.Close() })
	for _, db := range []*sql.DB{d.pg, d.lite} {
		if _, err := db.Exec("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT NOT NULL, balance INTEGER NOT NULL DEFAULT 0)"); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// lastQueryOf returns the text of the statement backend pid ran last.
func lastQueryOf(t *testing.T, raw *sql.DB, pid int) string {
	t.Helper()
	var q string
	if err := raw.QueryRow("SELECT query FROM pg_stat_activity WHERE pid = $1", pid).Scan(&q); err != nil {
		t.Fatal(err)
	}
	return q
}

// conservedIncrements runs 4 goroutines x 20 read-then-write increments of
// user 1's balance, each in fn's transaction after Lock; it returns the
// final balance.
func conservedIncrements(t *testing.T, read func() int, inc func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	before := read()
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 20 {
				if err := inc(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if got := read(); got != before+80 {
		t.Errorf("balance %d after 80 increments from %d: lost updates", got, before)
	}
}

func TestSQLX(t *testing.T) {
	d := open(t)
	// sqlx picks the bind style from the driver name; tell it about the
	// wrapped name once.
	sqlx.BindDriver("lockhooks+pgx", sqlx.DOLLAR)
	for name, db := range map[string]*sqlx.DB{
		"postgres": sqlx.NewDb(d.pg, "lockhooks+pgx"),
		"sqlite":   sqlx.NewDb(d.lite, "lockhooks+sqlite"),
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := db.NamedExec("INSERT INTO users (id, name) VALUES (:id, :name)", map[string]any{"id": 1, "name": "ada"}); err != nil {
				t.Fatal(err)
			}
			var user struct {
				ID      int    `db:"id"`
				Name    string `db:"name"`
				Balance int    `db:"balance"`
			}
			if err := db.Get(&user, db.Rebind("SELECT * FROM users WHERE id = ? FOR UPDATE"), 1); err != nil || user.Name != "ada" {
				t.Fatalf("Get: %+v, %v", user, err)
			}
			read := func() int {
				var b int
				db.Get(&b, "SELECT balance FROM users WHERE id = 1")
				return b
			}
			conservedIncrements(t, read, func(ctx context.Context) error {
				tx, err := db.BeginTxx(ctx, nil)
				if err != nil {
					return err
				}
				defer tx.Rollback()
				if err := lockhooks.Lock(ctx, tx.Tx, "users", 1); err != nil {
					return err
				}
				var b int
				if err := tx.Get(&b, "SELECT balance FROM users WHERE id = 1"); err != nil {
					return err
				}
				if _, err := tx.NamedExec("UPDATE users SET balance = :b WHERE id = 1", map[string]any{"b": b + 1}); err != nil {
					return err
				}
				return tx.Commit()
			})
		})
	}
}

type User struct {
	ID      int `gorm:"primaryKey"`
	Name    string
	Balance int
}

func TestGORM(t *testing.T) {
	d := open(t)
	// gorm.Open keeps and fills in its *gorm.Config: one per database.
	pg, err := gorm.Open(gormpostgres.New(gormpostgres.Config{Conn: d.pg}), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	lite, err := gorm.Open(gormsqlite.Dialector{Conn: d.lite}, &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	for name, db := range map[string]*gorm.DB{"postgres": pg, "sqlite": lite} {
		t.Run(name, func(t *testing.T) {
			if err := db.Create(&User{ID: 1, Name: "ada"}).Error; err != nil {
				t.Fatal(err)
			}
			read := func() int {
				var u User
				db.First(&u, 1)
				return u.Balance
			}
			conservedIncrements(t, read, func(ctx context.Context) error {
				return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
					sqlTx, ok := tx.Statement.ConnPool.(*sql.Tx)
					if !ok {
						t.Fatalf("GORM's transaction pool is %T", tx.Statement.ConnPool)
					}
					if err := lockhooks.Lock(ctx, sqlTx, "users", 1); err != nil {
						return err
					}
					var u User
					if err := tx.Clauses(clause.Locking{Strength: "UPDATE"}).First(&u, 1).Error; err != nil {
						return err
					}
					return tx.Model(&u).Update("balance", u.Balance+1).Error
				})
			})
		})
	}
	// On Postgres, GORM's clause.Locking{Strength: "UPDATE"} arrives as
	// FOR NO KEY UPDATE.
	err = pg.Transaction(func(tx *gorm.DB) error {
		var pid int
		tx.Raw("SELECT pg_backend_pid()").Scan(&pid)
		var u User
		if err := tx.Clauses(clause.Locking{Strength: "UPDATE"}).First(&u, 1).Error; err != nil {
			return err
		}
		if q := lastQueryOf(t, d.rawPG, pid); !strings.Contains(q, "FOR NO KEY UPDATE") {
			t.Errorf("the server ran %q", q)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestEnt(t *testing.T) {
	d := open(t)
	ctx := context.Background()
	pg := entsql.OpenDB(dialect.Postgres, d.pg)
	tx, err := pg.Tx(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := tx.Exec(ctx, "INSERT INTO users (id, name) VALUES ($1, $2)", []any{1, "ada"}, nil); err != nil {
		t.Fatal(err)
	}
	var pidRows entsql.Rows
	if err := tx.Query(ctx, "SELECT pg_backend_pid()", []any{}, &pidRows); err != nil {
		t.Fatal(err)
	}
	var pid int
	pidRows.Next()
	pidRows.Scan(&pid)
	pidRows.Close()
	// ent's ForUpdate(), as its generated code builds it.
	q, args := entsql.Dialect(dialect.Postgres).Select("id", "name").From(entsql.Table("users")).
		Where(entsql.EQ("id", 1)).ForUpdate().Query()
	var rows entsql.Rows
	if err := tx.Query(ctx, q, args, &rows); err != nil {
		t.Fatal(err)
	}
	rows.Close()
	if got := lastQueryOf(t, d.rawPG, pid); !strings.Contains(got, "FOR NO KEY UPDATE") || !strings.Contains(q, "FOR UPDATE") {
		t.Errorf("ent built %q; the server ran %q", q, got)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}

	// SQLite: ent's builder writes the same locking clause; lockhooks removes
	// it, so the query runs instead of failing with a syntax error.
	lite := entsql.OpenDB(dialect.SQLite, d.lite)
	if err := lite.Exec(ctx, "INSERT INTO users (id, name) VALUES (?, ?)", []any{1, "ada"}, nil); err != nil {
		t.Fatal(err)
	}
	sel := entsql.Dialect(dialect.SQLite).Select("name").From(entsql.Table("users")).Where(entsql.EQ("id", 1)).ForUpdate()
	if err := sel.Err(); err != nil {
		t.Logf("ent's SQLite builder refuses FOR UPDATE: %v", err)
		return
	}
	q, args = sel.Query()
	var lrows entsql.Rows
	if err := lite.Query(ctx, q, args, &lrows); err != nil {
		t.Fatalf("ent's %q on SQLite: %v", q, err)
	}
	var name string
	if !lrows.Next() || lrows.Scan(&name) != nil || name != "ada" {
		t.Errorf("ent's locking query on SQLite returned %q", name)
	}
	lrows.Close()
}
