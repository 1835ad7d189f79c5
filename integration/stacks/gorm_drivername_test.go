package stacks

import (
	"database/sql"
	"errors"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	gormpostgres "gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/lockhooks/lockhooks"
	"github.com/lockhooks/lockhooks/internal/pgtest"
)

// gadgetV1 and gadgetV2 are two versions of one model: V2 adds a column.
type gadgetV1 struct {
	ID   int
	Name string
}

func (gadgetV1) TableName() string { return "gadgets" }

type gadgetV2 struct {
	ID    int
	Name  string
	Price int
}

func (gadgetV2) TableName() string { return "gadgets" }

// migrateTwice runs AutoMigrate as a service does across two releases on
// one connection: create the table, start again (the migrator reads the
// table's columns with SELECT * … LIMIT 1), add a column, start again.
func migrateTwice(db *gorm.DB) error {
	for _, model := range []any{&gadgetV1{}, &gadgetV1{}, &gadgetV2{}, &gadgetV2{}} {
		if err := db.AutoMigrate(model); err != nil {
			return err
		}
	}
	return nil
}

// openGORM opens db with GORM's Postgres driver on one connection, so that
// pgx's statement cache is the same across the migrations.
func openGORM(t *testing.T, cfg gormpostgres.Config) *gorm.DB {
	t.Helper()
	db, err := gorm.Open(gormpostgres.New(cfg), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	sqlDB.SetMaxOpenConns(1)
	t.Cleanup(func() { sqlDB.Close() })
	return db
}

// GORM's Postgres driver turns its pgx handling on (the migrator's column
// query in the simple protocol, PreferSimpleProtocol, TimeZone) only when
// Config.DriverName is "" or "pgx". Named "lockhooks+pgx", in pgx's default
// statement-cache mode, AutoMigrate of an altered table fails with
// "cached plan must not change result type" (0A000). Handing GORM the
// *sql.DB (Config.Conn, the README's way) keeps DriverName empty and works;
// so does the DriverName form with a DSN that turns pgx's statement cache off.
func TestGORMDriverNameAndAutoMigrate(t *testing.T) {
	name, err := lockhooks.Register("pgx")
	if err != nil {
		t.Fatal(err)
	}

	t.Run("DriverName lockhooks+pgx fails", func(t *testing.T) {
		db := openGORM(t, gormpostgres.Config{DriverName: name, DSN: pgtest.DSN(t)})
		err := migrateTwice(db)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "0A000" {
			t.Fatalf("AutoMigrate after ALTER TABLE: %v, want SQLSTATE 0A000 (cached plan must not change result type); "+
				"if GORM now applies its pgx handling to other driver names, update the README's GORM section", err)
		}
		t.Logf("as documented: %v", err)
	})

	t.Run("Conn from lockhooks works", func(t *testing.T) {
		sqlDB, err := sql.Open(name, pgtest.DSN(t))
		if err != nil {
			t.Fatal(err)
		}
		db := openGORM(t, gormpostgres.Config{Conn: sqlDB})
		if err := migrateTwice(db); err != nil {
			t.Fatal(err)
		}
		if !db.Migrator().HasColumn(&gadgetV2{}, "Price") {
			t.Error("AutoMigrate did not add the price column")
		}
	})

	t.Run("DriverName with default_query_exec_mode=exec works", func(t *testing.T) {
		db := openGORM(t, gormpostgres.Config{DriverName: name, DSN: withParam(pgtest.DSN(t), "default_query_exec_mode", "exec")})
		if err := migrateTwice(db); err != nil {
			t.Fatal(err)
		}
	})
}

// withParam adds key=value to a URL or keyword/value DSN.
func withParam(dsn, key, value string) string {
	if u, err := url.Parse(dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		q := u.Query()
		q.Set(key, value)
		u.RawQuery = q.Encode()
		return u.String()
	}
	return dsn + " " + key + "=" + value
}
