package sqliteconn

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/lockhooks/lockhooks/internal/dberr"
	"github.com/lockhooks/lockhooks/internal/pgdriver"
	"github.com/lockhooks/lockhooks/internal/rawconn"
	"github.com/lockhooks/lockhooks/internal/retry"
	"github.com/lockhooks/lockhooks/internal/sqlitelock"
)

// Defaults is what lockhooks sets on the new connections of one SQLite
// database. Its methods may be called from any goroutine.
type Defaults struct {
	dsn      sqlitelock.DSN // what the DSN sets itself (its Known false: not read)
	dsnGiven bool           // the database was opened from a DSN, not a connector
	busy     time.Duration  // the busy timeout to set where the DSN sets none
	walTurn  chan struct{}  // one connection at a time switches the file to WAL
}

// NewDefaults returns the defaults of one database: dsn is what its DSN
// sets itself (zero, with dsnGiven false, for a database opened from a
// connector, whose DSN lockhooks cannot read), busy the busy timeout to set
// where the DSN sets none.
func NewDefaults(dsn sqlitelock.DSN, dsnGiven bool, busy time.Duration) *Defaults {
	return &Defaults{dsn: dsn, dsnGiven: dsnGiven, busy: busy, walTurn: make(chan struct{}, 1)}
}

// plural returns "s" unless n is 1.
func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// Apply sets on a new SQLite connection what lockhooks relies on,
// where the DSN's parsed parameters leave it unset: busy_timeout (the busy
// timeout), journal_mode=WAL (readers do not block the writer) and
// foreign_keys=ON. WAL is the one default that writes to the database file,
// so it is never applied on a read-only open (mode=ro, immutable=1,
// query_only), nor with _txlock=exclusive, whose promise to keep readers out
// holds only outside WAL; how the switch meets other connections is
// switchToWAL's. With a connector lockhooks cannot read the DSN, so it only
// sets a busy_timeout that is still SQLite's default of 0.
//
// Each pragma's result row is read before its rows are closed: some drivers
// run a statement only as its rows are stepped.
func (d *Defaults) Apply(ctx context.Context, inner driver.Conn) error {
	busy := "PRAGMA busy_timeout = " + strconv.FormatInt(d.busy.Milliseconds(), 10)
	dsn := d.dsn
	if !dsn.Known {
		if d.dsnGiven {
			return nil // unparsable: the driver itself refuses it
		}
		v, err := pragmaValue(ctx, inner, "PRAGMA busy_timeout")
		if err != nil {
			return fmt.Errorf("lockhooks: reading PRAGMA busy_timeout on a new SQLite connection: %w", err)
		}
		if pgdriver.AsInt64(v) != 0 {
			return nil
		}
		return d.sqlitePragma(ctx, inner, busy)
	}
	if !dsn.BusyTimeout {
		if err := d.sqlitePragma(ctx, inner, busy); err != nil {
			return err
		}
	}
	if !dsn.JournalMode && dsn.ReadOnly == "" && dsn.TxLock != "exclusive" {
		if err := d.switchToWAL(ctx, inner); err != nil {
			return err
		}
	}
	if !dsn.ForeignKeys {
		return d.sqlitePragma(ctx, inner, "PRAGMA foreign_keys = ON")
	}
	return nil
}

// sqlitePragma runs one of Apply's pragmas on a new connection.
func (d *Defaults) sqlitePragma(ctx context.Context, inner driver.Conn, pragma string) error {
	if _, err := pragmaValue(ctx, inner, pragma); err != nil {
		return fmt.Errorf("lockhooks: %s on a new SQLite connection failed: %w; set the pragma yourself in the DSN and lockhooks leaves it alone", pragma, err)
	}
	return nil
}

// The backoff between attempts of switchToWAL's PRAGMA journal_mode = WAL
// that met SQLITE_BUSY: jittered, from walRetryBase doubling up to
// walRetryCap, until the busy timeout is spent.
const (
	walRetryBase = time.Millisecond
	walRetryCap  = 50 * time.Millisecond
)

// switchToWAL sets journal_mode=WAL on a new connection, once per file: a
// connection that finds the file already in WAL writes nothing.
//
// The switch writes the database header, and SQLite answers SQLITE_BUSY at
// once, without waiting for busy_timeout, to a connection that meets
// another one's lock while it upgrades the read it began the switch with:
// connections opened together on a new file race for it. So the switches of
// one database's connections take turns (the database's WAL turn), and a switch that still
// meets SQLITE_BUSY (another database handle or process on the same file)
// is tried again with backoff until the connection's busy timeout is spent
// (the turn's wait counts in it), honouring ctx. The gate is not the writer
// lock: that is held across transactions, and database/sql opens a new
// connection while one of the same database is in a transaction (whose
// goroutine may be the one waiting for this connection); the gate is held
// only by switches, each bounded by the busy timeout.
//
// Any answer but an error is accepted: a temporary database, for one,
// stays in its journal mode. An in-memory database (journal_mode
// "memory", which a file never reads back on a new connection) is left
// alone.
func (d *Defaults) switchToWAL(ctx context.Context, inner driver.Conn) error {
	mode, err := pragmaValue(ctx, inner, "PRAGMA journal_mode")
	if err != nil {
		return fmt.Errorf("lockhooks: reading PRAGMA journal_mode on a new SQLite connection failed: %w", err)
	}
	switch strings.ToLower(pgdriver.AsString(mode)) {
	case "wal", "memory": // memory: an in-memory database, which has no WAL
		return nil
	}
	start := time.Now()
	budget := d.busy
	if d.dsn.BusyTimeout { // the DSN's, in force on the connection
		v, err := pragmaValue(ctx, inner, "PRAGMA busy_timeout")
		if err != nil {
			return fmt.Errorf("lockhooks: reading PRAGMA busy_timeout on a new SQLite connection failed: %w", err)
		}
		budget = time.Duration(pgdriver.AsInt64(v)) * time.Millisecond
	}
	if d.takeWALTurn(ctx, budget) {
		defer func() { <-d.walTurn }()
	} else if ctx.Err() != nil {
		return fmt.Errorf("lockhooks: gave up switching a new SQLite connection to WAL after %v waiting for another connection's switch: %w",
			time.Since(start).Round(time.Millisecond), context.Cause(ctx))
	}
	backoff := retry.Backoff{Base: walRetryBase, Cap: walRetryCap}
	for attempt := 1; ; attempt++ {
		_, err := pragmaValue(ctx, inner, "PRAGMA journal_mode = WAL")
		if err == nil {
			return nil
		}
		if ctx.Err() != nil { // the driver may report an interrupt of its own
			return fmt.Errorf("lockhooks: gave up switching a new SQLite connection to WAL after %d attempt%s in %v: %w (the last attempt: %w)",
				attempt, plural(attempt), time.Since(start).Round(time.Millisecond), context.Cause(ctx), err)
		}
		if code, ok := dberr.SQLiteCode(err); !ok || code&0xff != dberr.SQLiteBusy {
			return fmt.Errorf("lockhooks: PRAGMA journal_mode = WAL on a new SQLite connection failed: %w; set the pragma yourself in the DSN (for example _pragma=journal_mode(delete)) and lockhooks leaves it alone", err)
		}
		wait := backoff.After(attempt)
		left := budget - time.Since(start)
		if left <= 0 {
			return fmt.Errorf("lockhooks: PRAGMA journal_mode = WAL on a new SQLite connection still met SQLITE_BUSY after %d attempt%s in %v (the busy timeout is %v): another connection or process holds the database file's lock; raise the busy timeout (lockhooks.WithBusyTimeout, or the DSN's busy_timeout), or switch the file to WAL once before opening it from many connections: %w",
				attempt, plural(attempt), time.Since(start).Round(time.Millisecond), budget, err)
		}
		if cerr := retry.Sleep(ctx, min(wait, left)); cerr != nil {
			return fmt.Errorf("lockhooks: gave up switching a new SQLite connection to WAL after %d attempt%s in %v: %w (the last attempt: %w)",
				attempt, plural(attempt), time.Since(start).Round(time.Millisecond), cerr, err)
		}
	}
}

// takeWALTurn waits for this database's turn to switch a connection to
// WAL, at most budget (it never waits when budget is 0) and while ctx
// lasts, and reports whether it got it; the caller then releases it with
// <-d.walTurn.
func (d *Defaults) takeWALTurn(ctx context.Context, budget time.Duration) bool {
	select {
	case d.walTurn <- struct{}{}:
		return true
	default:
	}
	if budget <= 0 {
		return false
	}
	t := time.NewTimer(budget)
	defer t.Stop()
	select {
	case d.walTurn <- struct{}{}:
		return true
	case <-t.C:
		return false
	case <-ctx.Done():
		return false
	}
}

// pragmaValue runs a pragma on a raw connection and returns the first
// column of its one result row (nil when it answers no row). It steps the
// rows before closing them: a driver may run the statement only then.
func pragmaValue(ctx context.Context, inner driver.Conn, pragma string) (v driver.Value, err error) {
	rows, err := rawconn.Query(ctx, inner, pragma, nil)
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := rows.Close(); err == nil {
			err = cerr
		}
	}()
	dest := make([]driver.Value, len(rows.Columns()))
	if err := rows.Next(dest); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil
		}
		return nil, err
	}
	if len(dest) == 0 {
		return nil, nil
	}
	return dest[0], nil
}
