package pgtest

// A real PgBouncer in front of the test cluster, in two versions: the pooler
// tests run against each (a test matrix, [EachPooler]).
//
//   - [PgBouncer118]: Debian 12's package (/usr/sbin/pgbouncer), which
//     predates prepared-statement support (1.21). Its DSNs carry
//     default_query_exec_mode=exec (see below).
//   - [PgBouncer125]: PgBouncer 1.25.2 built from source by
//     .ci/build-pgbouncer, from the release vendored in third_party/ (found through
//     LOCKHOOKS_PGBOUNCER_1_25, else where that script puts it by default),
//     run with max_prepared_statements = 200: PgBouncer keeps the named
//     prepared statements of its clients and prepares them on whichever
//     server connection runs them, so its DSNs keep pgx's default statement
//     cache (cache_statement), as most production PgBouncers are run today.
//
// What lockhooks' tests may rely on (each point is checked by
// pgbouncer_test.go, against both versions unless it says otherwise):
//
//   - pool_mode = transaction (the default here): a client owns a server
//     connection only from the first statement of a transaction (or an
//     autocommit statement) to its end. Between transactions the server
//     connection goes back to the pool and may be given to another client,
//     and the client's next transaction may run on another server backend.
//     Session state (session advisory locks, SET, named prepared
//     statements) stays on the backend.
//   - pool_mode = session ([PoolerOptions].Mode): a client keeps one server
//     connection from its first statement until it disconnects; then
//     PgBouncer runs server_reset_query (DISCARD ALL, which also releases
//     session advisory locks) and gives the server connection to the next
//     client.
//   - server_round_robin = 0 (the default): idle server connections are
//     reused LIFO, the most recently released first; a new server connection
//     is opened only when none is idle and the pool (one per database and
//     user) is below default_pool_size. See handOver in pgbouncer_test.go for
//     the deterministic sequence that moves a client to another backend.
//   - application_name is one of the parameters PgBouncer tracks per client
//     (with client_encoding, DateStyle, TimeZone and
//     standard_conforming_strings): the client's startup application_name,
//     and any later SET application_name, is remembered, and whenever the
//     client is linked to a server connection whose value differs, PgBouncer
//     first sends it a SET. So pg_stat_activity.application_name of the
//     backend running a client's transaction (or autocommit statement) is
//     that client's application_name; after it the idle backend keeps the last
//     client's value until a client with another value is linked to it.
//     application_name_add_host is off, so the value is exactly the client's.
//     It needs no ignore_startup_parameters entry; extra_float_digits does
//     (lib/pq sends it at startup and PgBouncer refuses the connection
//     otherwise; pgx does not send it).
//   - pgx's query exec modes: the default, cache_statement, uses named
//     prepared statements ("stmtcache_…"), which PgBouncer 1.18 does not
//     manage: once a client moves to another backend its cached statement is
//     missing there ("prepared statement … does not exist", SQLSTATE 26000).
//     exec and simple_protocol run each statement in one round trip without
//     a named statement and work; so, in 1.18, do describe_exec and
//     cache_describe (they describe with the unnamed statement and parse
//     again for the execution, so the two round trips may use two backends
//     without harm). 1.18's DSNs carry default_query_exec_mode=exec: one
//     round trip per statement, so an autocommit statement is never split
//     across backends, the extended protocol with parameters sent separately
//     from the SQL text (unlike simple_protocol, which interpolates them on
//     the client), and no per-statement describe round trip. Its limit:
//     parameter types come from the Go values, so ambiguous ones (e.g.
//     map[string]string) are refused. With PgBouncer 1.25 and
//     max_prepared_statements every mode works, cache_statement included.
//
// A shared PgBouncer per version ([PoolerDSN], [SharedPooler],
// [SharedPoolerOf]) is started once per test binary, on first use;
// [StartPooler] starts one for a single test (e.g. with
// idle_transaction_timeout, or in session mode). All serve every database of
// the test server through a wildcard entry, so the databases each test
// creates need no reload. Clients are not authenticated (auth_type = any):
// PgBouncer logs in to the server as the user of the server's DSN, whatever
// user the client names. PgBouncer runs in the foreground as a child of the
// test binary (as the postgres system user when the tests run as root: it
// refuses root; the binary is then copied into the pooler's directory, which
// that user can read), is killed by the kernel if the test binary dies
// (Pdeathsig), and is stopped by [Stop]; a directory left by a killed binary
// is removed by the next one.

import (
	"context"
	"database/sql"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/testcaps"
	"github.com/lockhooks/lockhooks/internal/tiedproc"
)

// EnvRequirePgBouncer makes [PoolerDSN], [SharedPoolerOf], [EachPooler]
// and [StartPooler] fail, instead of skip, when a PgBouncer version is not
// installed (CI sets it, and builds 1.25 where it is absent).
const EnvRequirePgBouncer = "LOCKHOOKS_REQUIRE_PGBOUNCER"

// EnvPgBouncer125 names the PgBouncer 1.25 binary; without it the binary is
// looked for where .ci/build-pgbouncer puts it by default
// ($XDG_CACHE_HOME or ~/.cache, then pgbouncer-1.25.2/pgbouncer-1.25.2/build/pgbouncer).
const EnvPgBouncer125 = "LOCKHOOKS_PGBOUNCER_1_25"

// A Version is one PgBouncer the pooler tests run against, with the pgx
// settings its DSNs carry.
type Version string

// The versions of the test matrix.
const (
	// PgBouncer118 is Debian's package (1.18): no prepared statements, so
	// its DSNs carry default_query_exec_mode=exec.
	PgBouncer118 Version = "1.18"
	// PgBouncer125 is 1.25.2 built from source, with
	// max_prepared_statements = 200: its DSNs keep pgx's default statement
	// cache.
	PgBouncer125 Version = "1.25"
)

// Versions are the PgBouncers of the test matrix, in the order
// [EachPooler] runs them.
var Versions = []Version{PgBouncer118, PgBouncer125}

// String names the version and the exec mode its DSNs use, as subtests
// are named: "pgbouncer-1.18-exec", "pgbouncer-1.25-cache".
func (v Version) String() string {
	if v.keepsPrepared() {
		return "pgbouncer-" + string(v) + "-cache"
	}
	return "pgbouncer-" + string(v) + "-exec"
}

// keepsPrepared reports whether the version runs with
// max_prepared_statements (pgx's statement cache works through it).
func (v Version) keepsPrepared() bool { return v == PgBouncer125 }

// pgbouncerBin is where the Debian package puts the 1.18 binary; PATH is
// searched when it is absent.
var pgbouncerBin = "/usr/sbin/pgbouncer"

// poolerDirPrefix names the poolers' directories, so stale ones can be found.
const poolerDirPrefix = "lockhooks-pgbouncer-"

// PoolerOptions configure a dedicated PgBouncer started by [StartPooler].
type PoolerOptions struct {
	// Version is the PgBouncer to run; "" means PgBouncer118.
	Version Version
	// Mode is pool_mode: "transaction" (the default) or "session".
	Mode string
	// PoolSize is default_pool_size: at most this many server connections
	// per database. 0 means 2.
	PoolSize int
	// IdleTransactionTimeout is idle_transaction_timeout: PgBouncer closes a
	// client (and its server connection, so the backend's locks go) whose
	// transaction has been idle this long. 0 means never. PgBouncer checks
	// it about once a second, so expect that much lateness.
	IdleTransactionTimeout time.Duration
}

// Pooler is a running PgBouncer in front of the test server.
type Pooler struct {
	dir     string
	port    int
	user    string // the user in returned DSNs
	version Version
	mode    string
	cmd     *exec.Cmd
	proc    *tiedproc.Process // cmd, running
	stopped sync.Once
}

// sharedPooler is the shared PgBouncer of one version.
type sharedPooler struct {
	once sync.Once
	p    *Pooler
	err  error
}

var (
	sharedPoolers = map[Version]*sharedPooler{PgBouncer118: {}, PgBouncer125: {}}
	poolersMu     sync.Mutex
	poolers       = map[*Pooler]bool{} // running, stopped by Stop
	startMu       sync.Mutex           // serialises starts (free port races)
)

// PoolerDSN is [DSN] through PgBouncer 1.18: it returns the DSN of a new,
// empty database for t, dropped when t ends, whose connections go through a
// PgBouncer in transaction mode shared by the test binary (started on first
// use, stopped by [Stop]/[Main]) with default_pool_size = 2, so server
// connections really change hands between clients, and no
// idle_transaction_timeout. The DSN is a postgres:// URL with
// default_query_exec_mode=exec (see the package notes in pgbouncer.go for why
// not pgx's default). Without PostgreSQL it behaves like DSN; without
// PgBouncer it skips t with a loud message, or fails it when
// LOCKHOOKS_REQUIRE_PGBOUNCER=1. Pooler tests run against every version
// instead: see [EachPooler].
func PoolerDSN(t testing.TB) string {
	t.Helper()
	return SharedPooler(t).DSN(t)
}

// SharedPooler returns the PgBouncer 1.18 behind [PoolerDSN], starting it if
// needed; use it to look at [Pooler.Show].
func SharedPooler(t testing.TB) *Pooler {
	t.Helper()
	return SharedPoolerOf(t, PgBouncer118)
}

// SharedPoolerOf returns the PgBouncer of version v shared by the test
// binary (transaction mode, default_pool_size = 2), starting it if needed.
// Without that version it skips t with a loud message, or fails it when
// LOCKHOOKS_REQUIRE_PGBOUNCER=1.
func SharedPoolerOf(t testing.TB, v Version) *Pooler {
	t.Helper()
	needServer(t)
	sp, ok := sharedPoolers[v]
	if !ok {
		t.Fatalf("pgtest: unknown PgBouncer version %q (have %v)", v, Versions)
	}
	sp.once.Do(func() { sp.p, sp.err = startPooler(PoolerOptions{Version: v}) })
	if sp.err != nil {
		poolerUnavailable(t, sp.err)
	}
	select {
	case <-sp.p.proc.Exited():
		// Every later test of the version would fail to connect: say why.
		log, _ := os.ReadFile(filepath.Join(sp.p.dir, "pgbouncer.log"))
		t.Fatalf("pgtest: the shared PgBouncer %s (port %d) exited during the run: %v; its log:\n%s", v, sp.p.port, sp.p.proc.Err(), log)
	default:
	}
	return sp.p
}

// EachPooler runs f as a subtest of t once per version of the test matrix
// ([Versions]), named after it ([Version.String]), with that version's
// shared PgBouncer. A version that is not installed skips its subtest
// loudly (fails it under LOCKHOOKS_REQUIRE_PGBOUNCER=1).
func EachPooler(t *testing.T, f func(t *testing.T, p *Pooler)) {
	t.Helper()
	for _, v := range Versions {
		t.Run(v.String(), func(t *testing.T) { f(t, SharedPoolerOf(t, v)) })
	}
}

// StartPooler starts a PgBouncer for t alone, configured by opts, and stops it
// when t ends. Use [Pooler.DSN] for databases behind it.
func StartPooler(t testing.TB, opts PoolerOptions) *Pooler {
	t.Helper()
	needServer(t)
	p, err := startPooler(opts)
	if err != nil {
		poolerUnavailable(t, err)
	}
	t.Cleanup(p.stop)
	return p
}

// DSN returns the DSN of a new, empty database for t, dropped when t ends,
// reached through p (see Reach).
func (p *Pooler) DSN(t testing.TB) string {
	t.Helper()
	return p.Reach(t, newDatabase(t))
}

// DSNFor returns the DSN of the existing database db reached through p.
func (p *Pooler) DSNFor(db string) string { return p.dsnFor(db) }

// Reach returns the DSN of the existing database db, reached through p,
// for t, whose database is dropped when t ends (pgtest.DSN): before it is,
// p is given the time to finish any cancel request for a server
// connection of db (quiesce), since the drop ends those connections.
// Call it after the database was made, so that this runs first.
func (p *Pooler) Reach(t testing.TB, db string) string {
	t.Cleanup(func() { p.quiesce(db) })
	return p.dsnFor(db)
}

// quiesce waits, for at most five seconds, until p has no server
// connection of database db in a cancel state, three looks in a row.
// PgBouncer 1.18 crashes ("server_proto: server in bad state: 11",
// pgbouncer#822; fixed upstream in August 2023 by pgbouncer#927, after
// 1.19.1) when a server connection it sends a cancel request for (pgx
// sends one for a statement whose context ends, and PgBouncer for a
// client that closes mid-statement) is ended under it, as DROP DATABASE …
// WITH (FORCE) ends every server connection of db; a shared PgBouncer
// that crashes fails every later test of the binary. By
// the time the drop runs, the test's connections to db are closed (their
// cleanups ran first), so a cancel still in flight is the last one.
func (p *Pooler) quiesce(db string) {
	deadline := time.Now().Add(5 * time.Second)
	for clean := 0; clean < 3 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		select {
		case <-p.proc.Exited():
			return
		default:
		}
		servers, err := p.show("SERVERS")
		if err != nil {
			return // the drop's own error, if any, says more
		}
		clean++
		for _, s := range servers {
			if s["database"] == db && strings.Contains(s["state"], "cancel") {
				clean = 0
			}
		}
	}
}

func (p *Pooler) dsnFor(db string) string {
	query := "sslmode=disable"
	if !p.version.keepsPrepared() {
		query += "&default_query_exec_mode=exec"
	}
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User(p.user),
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port)),
		Path:     "/" + db,
		RawQuery: query,
	}
	return u.String()
}

// Port is the TCP port p listens on (127.0.0.1).
func (p *Pooler) Port() int { return p.port }

// Version is the PgBouncer p runs.
func (p *Pooler) Version() Version { return p.version }

// Mode is p's pool_mode: "transaction" or "session".
func (p *Pooler) Mode() string { return p.mode }

// KeepsPreparedStatements reports whether p manages its clients' named
// prepared statements (max_prepared_statements), so that pgx's default
// statement cache works through it in transaction mode.
func (p *Pooler) KeepsPreparedStatements() bool { return p.version.keepsPrepared() }

// Show runs SHOW <what> (POOLS, SERVERS, CLIENTS, …) on p's admin console
// and returns its rows, each a column → text value map.
func (p *Pooler) Show(t testing.TB, what string) []map[string]string {
	t.Helper()
	rows, err := p.show(what)
	if err != nil {
		t.Fatalf("pgtest: SHOW %s on PgBouncer: %v", what, err)
	}
	return rows
}

func (p *Pooler) show(what string) ([]map[string]string, error) {
	// The admin console speaks only the simple query protocol.
	u, err := url.Parse(p.dsnFor("pgbouncer"))
	if err != nil {
		return nil, err
	}
	q := u.Query()
	q.Set("default_query_exec_mode", "simple_protocol")
	u.RawQuery = q.Encode()
	dsn := u.String()
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rs, err := db.QueryContext(ctx, "SHOW "+what)
	if err != nil {
		return nil, err
	}
	defer rs.Close()
	cols, err := rs.Columns()
	if err != nil {
		return nil, err
	}
	var out []map[string]string
	for rs.Next() {
		vals := make([]sql.NullString, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rs.Scan(ptrs...); err != nil {
			return nil, err
		}
		row := make(map[string]string, len(cols))
		for i, c := range cols {
			row[c] = vals[i].String
		}
		out = append(out, row)
	}
	return out, rs.Err()
}

func poolerUnavailable(t testing.TB, err error) {
	t.Helper()
	testcaps.Skip(t, testcaps.PgBouncer, err.Error()) // fails under LOCKHOOKS_REQUIRE_PGBOUNCER=1
}
