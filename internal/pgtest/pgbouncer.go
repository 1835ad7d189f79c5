package pgtest

// A real PgBouncer in transaction mode in front of the test cluster.
//
// What lockhooks' tests may rely on (each point is checked by
// pgbouncer_test.go against PgBouncer 1.18, the Debian 12 package):
//
//   - pool_mode = transaction: a client owns a server connection only from
//     the first statement of a transaction (or an autocommit statement) to
//     its end. Between transactions the server connection goes back to the
//     pool and may be given to another client, and the client's next
//     transaction may run on another server backend. Session state (session
//     advisory locks, SET, named prepared statements) stays on the backend.
//   - server_round_robin = 0 (the default): idle server connections are
//     reused LIFO, the most recently released first; a new server connection
//     is opened only when none is idle and the pool (one per database and
//     user) is below default_pool_size. See handOver in pgbouncer_test.go for
//     the deterministic sequence that moves a client to another backend.
//   - application_name is one of the parameters PgBouncer 1.18 tracks per
//     client (with client_encoding, DateStyle, TimeZone and
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
//     manage (that came in 1.21): once a client moves to another backend its
//     cached statement is missing there ("prepared statement … does not
//     exist", SQLSTATE 26000). exec and simple_protocol run each statement
//     in one round trip without a named statement and work; so, in 1.18, do
//     describe_exec and cache_describe (they describe with the unnamed
//     statement and parse again for the execution, so the two round trips
//     may use two backends without harm). The DSNs here carry
//     default_query_exec_mode=exec: one round trip per statement, so an
//     autocommit statement is never split across backends, the extended
//     protocol with parameters sent separately from the SQL text (unlike
//     simple_protocol, which interpolates them on the client), and no
//     per-statement describe round trip. Its limit: parameter types come from
//     the Go values, so ambiguous ones (e.g. map[string]string) are refused.
//
// The shared PgBouncer ([PoolerDSN], [SharedPooler]) is started once per test
// binary, on first use; [StartPooler] starts one for a single test (e.g. with
// idle_transaction_timeout). Both serve every database of the test server
// through a wildcard entry, so the databases each test creates need no
// reload. Clients are not authenticated (auth_type = any): PgBouncer logs in
// to the server as the user of the server's DSN, whatever user the client
// names. PgBouncer runs in the foreground as a child of the test binary (as
// the postgres system user when the tests run as root: it refuses root), is
// killed by the kernel if the test binary dies (Pdeathsig), and is stopped by
// [Stop]; a directory left by a killed binary is removed by the next one.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
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

	"github.com/jackc/pgx/v5"
)

// EnvRequirePgBouncer makes [PoolerDSN] and [StartPooler] fail, instead of
// skip, when PgBouncer is not installed (CI sets it).
const EnvRequirePgBouncer = "LOCKHOOKS_REQUIRE_PGBOUNCER"

// pgbouncerBin is where the Debian package puts the binary; PATH is searched
// when it is absent.
var pgbouncerBin = "/usr/sbin/pgbouncer"

// poolerDirPrefix names the poolers' directories, so stale ones can be found.
const poolerDirPrefix = "lockhooks-pgbouncer-"

// PoolerOptions configure a dedicated PgBouncer started by [StartPooler].
type PoolerOptions struct {
	// PoolSize is default_pool_size: at most this many server connections
	// per database. 0 means 2.
	PoolSize int
	// IdleTransactionTimeout is idle_transaction_timeout: PgBouncer closes a
	// client (and its server connection, so the backend's locks go) whose
	// transaction has been idle this long. 0 means never. PgBouncer checks
	// it about once a second, so expect that much lateness.
	IdleTransactionTimeout time.Duration
}

// Pooler is a running PgBouncer (pool_mode = transaction) in front of the
// test server.
type Pooler struct {
	dir     string
	port    int
	user    string // the user in returned DSNs
	cmd     *exec.Cmd
	exited  chan struct{} // closed when cmd has been waited for
	waitErr error
	stopped sync.Once
}

var (
	sharedOnce sync.Once
	shared     *Pooler
	sharedErr  error
	poolersMu  sync.Mutex
	poolers    = map[*Pooler]bool{} // running, stopped by Stop
	startMu    sync.Mutex           // serialises starts (free port races)
)

// PoolerDSN is [DSN] through PgBouncer: it returns the DSN of a new, empty
// database for t, dropped when t ends, whose connections go through a
// PgBouncer in transaction mode shared by the test binary (started on first
// use, stopped by [Stop]/[Main]) with default_pool_size = 2, so server
// connections really change hands between clients, and no
// idle_transaction_timeout. The DSN is a postgres:// URL with
// default_query_exec_mode=exec (see the package notes in pgbouncer.go for why
// not pgx's default). Without PostgreSQL it behaves like DSN; without
// PgBouncer it skips t with a loud message, or fails it when
// LOCKHOOKS_REQUIRE_PGBOUNCER=1.
func PoolerDSN(t testing.TB) string {
	t.Helper()
	return SharedPooler(t).DSN(t)
}

// SharedPooler returns the PgBouncer behind [PoolerDSN], starting it if
// needed; use it to look at [Pooler.Show].
func SharedPooler(t testing.TB) *Pooler {
	t.Helper()
	needServer(t)
	sharedOnce.Do(func() { shared, sharedErr = startPooler(PoolerOptions{}) })
	if sharedErr != nil {
		poolerUnavailable(t, sharedErr)
	}
	return shared
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
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User(p.user),
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port)),
		Path:     "/" + db,
		RawQuery: "sslmode=disable&default_query_exec_mode=exec",
	}
	return u.String()
}

// Port is the TCP port p listens on (127.0.0.1).
func (p *Pooler) Port() int { return p.port }

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
	dsn := strings.Replace(p.dsnFor("pgbouncer"), "default_query_exec_mode=exec", "default_query_exec_mode=simple_protocol", 1)
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

// findPgBouncer returns the path of the pgbouncer binary.
func findPgBouncer() (string, error) {
	if _, err := os.Stat(pgbouncerBin); err == nil {
		return pgbouncerBin, nil
	}
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	return "", errors.New("no pgbouncer at " + pgbouncerBin + " or on PATH")
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
	bin, err := findPgBouncer()
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
		p := &Pooler{dir: dir, port: port, user: usr}
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
	return strings.Join([]string{
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
		"pool_mode = transaction",
		"default_pool_size = " + strconv.Itoa(opts.PoolSize),
		"min_pool_size = 0",
		"reserve_pool_size = 0",
		"max_client_conn = 200",
		"server_round_robin = 0",
		// Transaction mode runs no reset query between clients.
		"server_reset_query =",
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
		"",
	}, "\n")
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
		// Dies with the test binary, even when that is SIGKILLed.
		Pdeathsig: syscall.SIGKILL,
		Setpgid:   true, // not hit by the terminal's ^C meant for go test
	}
	if err := p.cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", bin, err)
	}
	p.exited = make(chan struct{})
	go func() {
		p.waitErr = p.cmd.Wait()
		close(p.exited)
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port)), time.Second)
		if err == nil {
			conn.Close()
			return nil
		}
		select {
		case <-p.exited:
			log, _ := os.ReadFile(logPath)
			return fmt.Errorf("PgBouncer exited: %v\n%s", p.waitErr, log)
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
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	select {
	case <-p.exited:
		return
	default:
	}
	// SIGTERM: immediate shutdown in 1.18 (SIGINT would first wait for
	// every server connection to be released, i.e. for open transactions).
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
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
			if pid, err := strconv.Atoi(strings.TrimSpace(string(raw))); err == nil && isPgBouncer(pid) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		os.RemoveAll(dir)
	}
}

// isPgBouncer reports whether process pid is a pgbouncer (not a reused pid).
func isPgBouncer(pid int) bool {
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return err == nil && strings.TrimSpace(string(comm)) == "pgbouncer"
}
