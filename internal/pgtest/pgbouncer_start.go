package pgtest

// Starting and stopping PgBouncer processes: finding the binary of a
// version, writing its configuration, running it as a child tied to the
// test binary, and sweeping away poolers a killed binary left behind.

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/lockhooks/lockhooks/internal/tiedproc"

	"github.com/jackc/pgx/v5"
)

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
			return "", fmt.Errorf("no PgBouncer 1.25 at %s (build it with .ci/build-pgbouncer at the repository's root, or set %s): %w", bin, EnvPgBouncer125, err)
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
