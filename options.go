package lockhooks

// Options: what a lockhooks database is told (dialect, logger, rewrites,
// intervals and timeouts), resolved once per driver against the inner
// driver, whose package names the dialect when no option does.

import (
	"fmt"
	"log/slog"
	"reflect"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// An Option configures a wrapped driver or connector.
type Option func(*options)

// options is the configuration shared by every connection of one wrapper.
type options struct {
	dialect           Dialect
	logger            *slog.Logger
	keyShareRewrite   bool
	meterProvider     metric.MeterProvider
	lockCheckInterval time.Duration
	lockCheckTimeout  time.Duration
	parkedWarning     time.Duration
	busyTimeout       time.Duration
	tracerProvider    trace.TracerProvider
	rootSpans         bool
	blockerThreshold  time.Duration
	statementSpans    bool
	verifyOnReturn    bool
	txPooler          bool
	pinningPooler     bool       // WithSessionPinningPooler
	lockOrder         *lockOrder // WithLockOrderCheck; nil: off
	slowLockLog       time.Duration
	poolName          string // WithPoolName; "" for the default

	// testReleaseBeforeCommit, set only by tests, breaks the lockset rule on
	// purpose: locks are released before COMMIT, and the hook runs between.
	testReleaseBeforeCommit func()
}

// Defaults of the advisory-lock options.
const (
	defaultLockCheckInterval = time.Second
	defaultLockCheckTimeout  = 5 * time.Second
	defaultParkedWarning     = time.Minute
	defaultBusyTimeout       = 5 * time.Second
	defaultBlockerThreshold  = 500 * time.Millisecond
)

// WithDialect fixes the SQL dialect instead of inferring it from the inner
// driver. It is needed for drivers lockhooks does not recognise; the
// recognised ones are pgx (v4 and v5 stdlib), lib/pq, modernc.org/sqlite,
// mattn/go-sqlite3 and ncruces/go-sqlite3.
func WithDialect(d Dialect) Option {
	return func(o *options) { o.dialect = d }
}

// WithLogger sets where lockhooks reports what it cannot return as an error,
// such as a parked lock that was lost. The default is [slog.Default].
func WithLogger(l *slog.Logger) Option {
	return func(o *options) { o.logger = l }
}

// WithKeyShareRewrite turns the Postgres rewrite of FOR UPDATE into
// FOR NO KEY UPDATE on or off; it is on by default. FOR NO KEY UPDATE still
// excludes every other writer of the row, but not the FOR KEY SHARE locks
// that foreign-key checks take on parent rows, so inserting or updating
// child rows no longer waits for, or deadlocks with, a parent locked
// FOR UPDATE. Keep FOR UPDATE per statement with [KeepForUpdate] or
// [KeepForUpdateComment] where the row will be deleted or its key changed.
// On SQLite, locking clauses are always removed (SQLite has none).
func WithKeyShareRewrite(on bool) Option {
	return func(o *options) { o.keyShareRewrite = on }
}

// WithLockCheckInterval sets how often lockhooks checks, on a side
// connection of its own, that the backends holding session advisory locks
// are alive (default 1s). A lock whose backend died is reported lost within
// about this time even when nobody uses its connection.
func WithLockCheckInterval(d time.Duration) Option {
	return func(o *options) {
		if d > 0 {
			o.lockCheckInterval = d
		}
	}
}

// WithBusyTimeout sets how long an SQLite writer waits for the in-process
// writer lock before failing with [ErrWriterLockTimeout] (default 5s): the
// longest such wait of a statement or transaction, [RunInTx] included,
// which does not retry the timeout unless asked ([RetryLockNotAvailable]).
// It is also the busy_timeout lockhooks sets on connections whose DSN sets
// none, for waits on other processes.
func WithBusyTimeout(d time.Duration) Option {
	return func(o *options) {
		if d > 0 {
			o.busyTimeout = d
		}
	}
}

// WithParkedLockWarning sets after how long a session advisory lock held by
// a connection withdrawn from the pool is logged as a warning, with its key,
// backend pid, age and the call site that took it (default 1 minute; 0
// turns the warning off).
func WithParkedLockWarning(d time.Duration) Option {
	return func(o *options) { o.parkedWarning = d }
}

// WithVerifyOnReturn makes lockhooks read a Postgres connection's advisory
// locks in pg_locks each time database/sql returns it to the pool, and park
// it if it holds any. It finds session locks taken where no statement text
// shows them: a server-side function that calls pg_advisory_lock, a
// procedure, a trigger. It costs one round trip per return to the pool
// (every db.Exec, every transaction; see BENCHMARKS.md), so it is off by
// default. Statements whose text mentions advisory locks are tracked
// without it (see the README's "What lockhooks tracks").
func WithVerifyOnReturn(on bool) Option {
	return func(o *options) { o.verifyOnReturn = on }
}

// driverPackages maps the import path of a driver's package to its dialect.
var driverPackages = map[string]Dialect{
	"github.com/jackc/pgx/v5/stdlib":       Postgres,
	"github.com/jackc/pgx/v4/stdlib":       Postgres,
	"github.com/lib/pq":                    Postgres,
	"modernc.org/sqlite":                   SQLite,
	"github.com/mattn/go-sqlite3":          SQLite,
	"github.com/ncruces/go-sqlite3/driver": SQLite,
}

// inferDialect returns the dialect of the first value whose package is known.
func inferDialect(values ...any) (Dialect, bool) {
	for _, v := range values {
		if d, ok := driverPackages[packageOf(v)]; ok {
			return d, true
		}
	}
	return "", false
}

// packageOf returns the import path of the package that defines v's type
// (behind any pointers), or "".
func packageOf(v any) string {
	t := reflect.TypeOf(v)
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil {
		return ""
	}
	return t.PkgPath()
}

// resolveOptions applies opts and settles the dialect. inner names the
// wrapped driver or connector for error messages and inference.
func resolveOptions(opts []Option, inner ...any) (*options, error) {
	o := &options{
		keyShareRewrite:   true,
		lockCheckInterval: defaultLockCheckInterval,
		lockCheckTimeout:  defaultLockCheckTimeout,
		parkedWarning:     defaultParkedWarning,
		busyTimeout:       defaultBusyTimeout,
		blockerThreshold:  defaultBlockerThreshold,
		slowLockLog:       defaultSlowLockLog,
	}
	for _, opt := range opts {
		if opt != nil {
			opt(o)
		}
	}
	if o.logger == nil {
		o.logger = slog.Default()
	}
	if o.txPooler && o.pinningPooler {
		return nil, errPoolerOptions
	}
	switch o.dialect {
	case Postgres, SQLite:
		return o, nil
	case "":
		if d, ok := inferDialect(inner...); ok {
			o.dialect = d
			return o, nil
		}
		return nil, fmt.Errorf("%w: cannot tell whether %s speaks PostgreSQL or SQLite; pass lockhooks.WithDialect(lockhooks.Postgres) or lockhooks.WithDialect(lockhooks.SQLite)",
			ErrUnknownDialect, describe(inner[0]))
	default:
		return nil, fmt.Errorf("%w: %q is not supported; use lockhooks.Postgres or lockhooks.SQLite", ErrUnknownDialect, string(o.dialect))
	}
}

// describe names v's type and package for error messages.
func describe(v any) string {
	t := reflect.TypeOf(v)
	if t == nil {
		return "<nil>"
	}
	base := t
	for base.Kind() == reflect.Pointer {
		base = base.Elem()
	}
	if base.PkgPath() == "" {
		return fmt.Sprintf("driver %s", t)
	}
	return fmt.Sprintf("driver %s (package %s)", t, base.PkgPath())
}
