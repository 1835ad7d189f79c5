package pgtest

// A real PgBouncer in front of the test cluster, in two versions: the pooler
// tests run against each (a test matrix, [EachPooler]).
//
//   - [PgBouncer118]: Debian 12's package (/usr/sbin/pgbouncer), which
//     predates prepared-statement support (1.21). Its DSNs carry
//     default_query_exec_mode=exec (see below).
//   - [PgBouncer125]: PgBouncer 1.25.2 built from source by
//     ../shared/tools/build-pgbouncer (found through
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
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/testcaps"
	"github.com/lockhooks/lockhooks/internal/tiedproc"

	"github.com/jackc/pgx/v5"
)

// EnvRequirePgBouncer makes [PoolerDSN], [SharedPoolerOf], [EachPooler]
// and [StartPooler] fail, instead of skip, when a PgBouncer version is not
// installed (CI sets it, and builds 1.25 where it is absent).
const EnvRequirePgBouncer = "LOCKHOOKS_REQUIRE_PGBOUNCER"

// EnvPgBouncer125 names the PgBouncer 1.25 binary; without it the binary is
// looked for where ../shared/tools/build-pgbouncer puts it by default
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
// reached through p.
func (p *Pooler) DSN(t testing.TB) string {
	t.Helper()
	name := newDatabase(t)
	return p.dsnFor(name)
}

// DSNFor returns the DSN of the existing database db reached through p.
func (p *Pooler) DSNFor(db string) string { return p.dsnFor(db) }

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

// findPgBouncer returns the path of version v's pgbouncer binary.
func findPgBouncer(v Version) (string, error) {
	switch v {
	case PgBouncer118:
		if _, err := os.Stat(pgbouncerBin); err == nil {
			return pgbouncerBin, nil
		}
		if p, err := exec.LookPath("pgbouncer"); err == nil {
			return p, nil
		}
		return "", errors.New("no pgbouncer at " + pgbouncerBin + " or on PATH (apt-get install pgbouncer)")
	case PgBouncer125:
		bin := os.Getenv(EnvPgBouncer125)
		if bin == "" {
			cache := os.Getenv("XDG_CACHE_HOME")
			if cache == "" {
				home, err := os.UserHomeDir()
				if err != nil {
					return "", fmt.Errorf("no %s, and no home directory to look for PgBouncer 1.25 in: %w", EnvPgBouncer125, err)
				}
				cache = filepath.Join(home, ".cache")
			}
			bin = filepath.Join(cache, "pgbouncer-1.25.2", "pgbouncer-1.25.2", "build", "pgbouncer")
		}
		if _, err := os.Stat(bin); err != nil {
			return "", fmt.Errorf("no PgBouncer 1.25 at %s (build it with ../shared/tools/build-pgbouncer, or set %s): %w", bin, EnvPgBouncer125, err)
		}
		return bin, nil
	}
	return "", fmt.Errorf("unknown PgBouncer version %q", v)
}

// copyBinary copies the executable bin into dir, for a system user that
// cannot read where it is (a binary built under /root), and returns the
// copy's path.
func copyBinary(bin, dir string, uid, gid int) (string, error) {
	src, err := os.Open(bin)
	if err != nil {
		return "", err
	}
	defer src.Close()
	dst := filepath.Join(dir, "pgbouncer")
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return "", err
	}
	if _, err := io.Copy(out, src); err != nil {
		out.Close()
		return "", err
	}
	if err := out.Close(); err != nil {
		return "", err
	}
	return dst, os.Chown(dst, uid, gid)
}

// upstream is the server PgBouncer connects to, taken from the admin DSN.
func upstream() (host string, port uint16, usr, password string, err error) {
	cfg, err := pgx.ParseConfig(adminTo)
	if err != nil {
		return "", 0, "", "", err
	}
	return cfg.Host, cfg.Port, cfg.User, cfg.Password, nil
}

// quoteConn quotes a value for a [databases] connection string.
func quoteConn(v string) string {
	return "'" + strings.ReplaceAll(v, "'", "''") + "'"
}

// startPooler starts a PgBouncer in front of the server found by start.
func startPooler(opts PoolerOptions) (*Pooler, error) {
	if opts.Version == "" {
		opts.Version = PgBouncer118
	}
	switch opts.Mode {
	case "":
		opts.Mode = "transaction"
	case "transaction", "session":
	default:
		return nil, fmt.Errorf("pgtest: pool_mode %q: want transaction or session", opts.Mode)
	}
	bin, err := findPgBouncer(opts.Version)
	if err != nil {
		return nil, err
	}
	host, pgPort, usr, password, err := upstream()
	if err != nil {
		return nil, fmt.Errorf("reading the server's DSN: %w", err)
	}
	removeStalePoolers()
	if opts.PoolSize <= 0 {
		opts.PoolSize = 2
	}
	dir, err := os.MkdirTemp("", poolerDirPrefix)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	// PgBouncer refuses to run as root: run it as the postgres system user,
	// which must then own the directory (pid file, unix socket).
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("running as root, PgBouncer needs the postgres system user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		if err := os.Chmod(dir, 0o755); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		if bin, err = copyBinary(bin, dir, uid, gid); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("copying PgBouncer for the postgres system user: %w", err)
		}
	}
	target := fmt.Sprintf("host=%s port=%d user=%s", quoteConn(host), pgPort, quoteConn(usr))
	if password != "" {
		target += " password=" + quoteConn(password)
	}
	startMu.Lock()
	defer startMu.Unlock()
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		port, err := freePort()
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		p := &Pooler{dir: dir, port: port, user: usr, version: opts.Version, mode: opts.Mode}
		if lastErr = p.run(bin, cred, target, opts); lastErr == nil {
			poolersMu.Lock()
			poolers[p] = true
			poolersMu.Unlock()
			return p, nil
		}
	}
	os.RemoveAll(dir)
	return nil, lastErr
}

// config is PgBouncer's configuration file.
func (p *Pooler) config(target string, opts PoolerOptions) string {
	lines := []string{
		"[databases]",
		// A wildcard: the databases each test creates are reachable without
		// a reload (PgBouncer makes an "autodb" pool per name on first use).
		"* = " + target,
		"",
		"[pgbouncer]",
		"listen_addr = 127.0.0.1",
		"listen_port = " + strconv.Itoa(p.port),
		"unix_socket_dir = " + p.dir,
		"pidfile = " + filepath.Join(p.dir, "pgbouncer.pid"),
		// any: no client authentication, every client logs in to the server
		// as the user in [databases]; the admin console lets any user in.
		"auth_type = any",
		"admin_users = " + p.user,
		"stats_users = " + p.user,
		"pool_mode = " + opts.Mode,
		"default_pool_size = " + strconv.Itoa(opts.PoolSize),
		"min_pool_size = 0",
		"reserve_pool_size = 0",
		"max_client_conn = 200",
		"server_round_robin = 0",
		// lib/pq sends extra_float_digits at startup, which PgBouncer
		// refuses unless told to ignore it; pgx sends nothing it refuses.
		// application_name needs no entry: PgBouncer tracks it.
		"ignore_startup_parameters = extra_float_digits",
		"application_name_add_host = 0",
		"idle_transaction_timeout = " + strconv.FormatFloat(opts.IdleTransactionTimeout.Seconds(), 'f', -1, 64),
		"autodb_idle_timeout = 60",
		"log_connections = 0",
		"log_disconnections = 0",
		"log_pooler_errors = 1",
	}
	if opts.Mode == "transaction" {
		// Transaction mode runs no reset query between clients; session
		// mode keeps the default, DISCARD ALL, which also releases the
		// session advisory locks a client left behind.
		lines = append(lines, "server_reset_query =")
	}
	if opts.Version.keepsPrepared() {
		// Named prepared statements are tracked per client and prepared on
		// each server connection that runs them (1.21 and later).
		lines = append(lines, "max_prepared_statements = 200")
	}
	return strings.Join(lines, "\n") + "\n"
}

// run starts PgBouncer on p.port and waits until it accepts connections.
func (p *Pooler) run(bin string, cred *syscall.Credential, target string, opts PoolerOptions) error {
	ini := filepath.Join(p.dir, "pgbouncer.ini")
	if err := os.WriteFile(ini, []byte(p.config(target, opts)), 0o644); err != nil {
		return err
	}
	logPath := filepath.Join(p.dir, "pgbouncer.log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	defer logFile.Close()          // the child has its own copy
	p.cmd = exec.Command(bin, ini) // foreground: the handle is PgBouncer itself
	p.cmd.Dir = p.dir
	p.cmd.Stdout, p.cmd.Stderr = logFile, logFile
	p.cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: cred,
		Setpgid:    true, // not hit by the terminal's ^C meant for go test
	}
	// Dies with the test binary, even when that is SIGKILLed, and not
	// before (see tiedproc).
	proc, err := tiedproc.Start(p.cmd)
	if err != nil {
		return fmt.Errorf("starting %s: %w", bin, err)
	}
	p.proc = proc
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port)), time.Second)
		if err == nil {
			conn.Close()
			return nil
		}
		select {
		case <-p.proc.Exited():
			log, _ := os.ReadFile(logPath)
			return fmt.Errorf("PgBouncer exited: %v\n%s", p.proc.Err(), log)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.kill()
			log, _ := os.ReadFile(logPath)
			return fmt.Errorf("PgBouncer did not listen on port %d within 30s\n%s", p.port, log)
		}
	}
}

// kill stops the PgBouncer process and waits for it.
func (p *Pooler) kill() {
	if p.proc == nil {
		return
	}
	select {
	case <-p.proc.Exited():
		return
	default:
	}
	// SIGTERM: immediate shutdown in 1.18 (SIGINT would first wait for
	// every server connection to be released, i.e. for open transactions).
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.proc.Exited():
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.proc.Exited()
	}
}

// stop stops p and removes its directory.
func (p *Pooler) stop() {
	p.stopped.Do(func() {
		p.kill()
		os.RemoveAll(p.dir)
		poolersMu.Lock()
		delete(poolers, p)
		poolersMu.Unlock()
	})
}

// stopPoolers stops every running PgBouncer; Stop calls it.
func stopPoolers() {
	poolersMu.Lock()
	var ps []*Pooler
	for p := range poolers {
		ps = append(ps, p)
	}
	poolersMu.Unlock()
	for _, p := range ps {
		p.stop()
	}
}

// removeStalePoolers stops and removes poolers whose test binary is gone
// (Pdeathsig normally kills them with it; this catches the rest).
func removeStalePoolers() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), poolerDirPrefix+"*"))
	for _, dir := range dirs {
		raw, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			continue
		}
		owner, err := strconv.Atoi(strings.TrimSpace(string(raw)))
		if err != nil || alive(owner) {
			continue
		}
		if raw, err := os.ReadFile(filepath.Join(dir, "pgbouncer.pid")); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(raw))); err == nil && isPgBouncerOf(pid, dir) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		os.RemoveAll(dir)
	}
}

// isPgBouncerOf reports whether process pid is the pgbouncer that runs
// from dir's configuration: pids are reused within a run (the kernel's
// pid_max may be 32768), so a stale pid file can name another binary's
// live pooler, which must not be killed.
func isPgBouncerOf(pid int, dir string) bool {
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil || strings.TrimSpace(string(comm)) != "pgbouncer" {
		return false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	for _, arg := range strings.Split(string(cmdline), "\x00") {
		if arg == filepath.Join(dir, "pgbouncer.ini") {
			return true
		}
	}
	return false
}
