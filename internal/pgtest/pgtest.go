package pgtest

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
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the admin connection

	"github.com/lockhooks/lockhooks/internal/testcaps"
)

// Environment variables read by this package.
const (
	EnvDSN     = "LOCKHOOKS_TEST_PG_DSN"
	EnvRequire = "LOCKHOOKS_REQUIRE_PG"
)

// dirPrefix names the clusters' directories, so stale ones can be found.
const dirPrefix = "lockhooks-pgtest-"

// ownerFile in a cluster directory holds the pid of the test binary that
// started it.
const ownerFile = "owner.pid"

// settings make the throwaway cluster fast; no data here must survive.
var settings = []string{
	"fsync = off",
	"synchronous_commit = off",
	"full_page_writes = off",
	"max_connections = 300",
	"shared_buffers = 64MB",
	"listen_addresses = '127.0.0.1'",
	"log_min_messages = warning",
}

var (
	once    sync.Once
	server  *cluster // nil when startErr is set
	admin   *sql.DB
	adminTo string // DSN template, database name replaced per test
	started error  // why no server is available
	dbSeq   atomic.Int64
)

// cluster is a running private cluster.
type cluster struct {
	dir    string // owns data/, the socket and the log
	bin    string // directory of initdb and pg_ctl
	port   int
	asUser bool // run the binaries as the postgres system user
}

// Main runs the package's tests, then stops the private cluster, if one
// was started, and reports what the tests skipped for want of PostgreSQL,
// PgBouncer, Chromium or Prometheus where `go test` shows it, also without
// -v (see testcaps.Report). Use it from TestMain:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
func Main(m *testing.M) {
	code := m.Run()
	Stop()
	testcaps.Report()
	os.Exit(code)
}

// Stop stops the PgBouncers started for the tests, then stops and removes
// the private cluster, if one was started.
func Stop() {
	stopPoolers()
	if admin != nil {
		admin.Close()
	}
	if server != nil {
		server.stop()
	}
}

// DSN returns the DSN (a postgres:// URL) of a new, empty database for t,
// dropped when t ends. Without a server it skips t with a loud message, or
// fails it when LOCKHOOKS_REQUIRE_PG=1.
func DSN(t testing.TB) string {
	t.Helper()
	needServer(t)
	return withDatabase(adminTo, newDatabase(t))
}

// newDatabase creates a new, empty database for t, dropped when t ends, and
// returns its name.
func newDatabase(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("t%d_%s", dbSeq.Add(1), sanitize(t.Name()))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("pgtest: creating database %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := admin.ExecContext(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("pgtest: dropping database %s: %v", name, err)
		}
	})
	return name
}

// needServer starts or finds the server, or skips t with a loud message (fails
// it when LOCKHOOKS_REQUIRE_PG=1) when there is none.
func needServer(t testing.TB) {
	t.Helper()
	once.Do(start)
	if started != nil {
		testcaps.Skip(t, testcaps.PostgreSQL, started.Error()) // fails under LOCKHOOKS_REQUIRE_PG=1
	}
}

var notIdent = regexp.MustCompile(`[^a-z0-9_]+`)

// sanitize turns a test name into part of a database name.
func sanitize(name string) string {
	s := notIdent.ReplaceAllString(strings.ToLower(name), "_")
	if len(s) > 40 {
		s = s[:40]
	}
	return s
}

// withDatabase returns dsn with its database replaced by db.
func withDatabase(dsn, db string) string {
	if u, err := url.Parse(dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.Path = "/" + db
		return u.String()
	}
	return dsn + " dbname=" + db
}

// start finds or starts a server and opens the admin connection.
func start() {
	dsn := os.Getenv(EnvDSN)
	if dsn == "" {
		c, err := startCluster()
		if err != nil {
			started = err
			return
		}
		server = c
		dsn = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
	}
	db, err := sql.Open("pgx", dsn)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err = db.PingContext(ctx)
		cancel()
	}
	if err != nil {
		started = fmt.Errorf("connecting to %s: %w", redact(dsn), err)
		if server != nil {
			server.stop()
			server = nil
		}
		return
	}
	db.SetMaxOpenConns(2)
	admin, adminTo = db, dsn
}

// redact hides a password in dsn.
func redact(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && u.User != nil {
		return u.Redacted()
	}
	return dsn
}

// findBin returns the directory holding initdb and pg_ctl.
func findBin() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", errors.New("no initdb on PATH or under /usr/lib/postgresql/*/bin (apt-get install postgresql)")
}

// version reads the major version from /usr/lib/postgresql/<v>/bin.
func version(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

// startCluster creates and starts a new private cluster.
func startCluster() (*cluster, error) {
	bin, err := findBin()
	if err != nil {
		return nil, err
	}
	removeStale(bin)
	dir, err := os.MkdirTemp("", dirPrefix)
	if err != nil {
		return nil, err
	}
	c := &cluster{dir: dir, bin: bin, asUser: os.Geteuid() == 0}
	if err := c.create(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := c.serve(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("starting PostgreSQL: %w", err)
	}
	return c, nil
}

// serve starts the server on a free port (three tries: another process may
// take the port in between), waiting until it accepts connections; the
// error carries the server's log.
func (c *cluster) serve() error {
	var err error
	for range 3 {
		if c.port, err = freePort(); err != nil {
			return err
		}
		if err = c.run("pg_ctl", "start", "-w", "-t", "60", "-D", c.data(), "-l", filepath.Join(c.dir, "server.log"),
			"-o", fmt.Sprintf("-p %d -k %s", c.port, c.dir)); err == nil {
			return nil
		}
	}
	log, _ := os.ReadFile(filepath.Join(c.dir, "server.log"))
	return fmt.Errorf("%w\n%s", err, log)
}

func (c *cluster) data() string { return filepath.Join(c.dir, "data") }

// create runs initdb and writes the settings and the owner pid.
func (c *cluster) create() error {
	if err := c.claimDir(); err != nil {
		return err
	}
	if err := c.run("initdb", "-D", c.data(), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync", "--no-instructions"); err != nil {
		return err
	}
	conf := filepath.Join(c.data(), "postgresql.conf")
	f, err := os.OpenFile(conf, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString("\n# lockhooks pgtest\n" + strings.Join(settings, "\n") + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// claimDir writes the owner pid into c's directory (a cluster left by a
// killed binary is stopped and removed like any stale one) and, running as
// root, gives the directory to the postgres user, as whom the server runs.
func (c *cluster) claimDir() error {
	if err := os.WriteFile(filepath.Join(c.dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return err
	}
	if !c.asUser {
		return nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return fmt.Errorf("running as root, the server needs the postgres system user: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chown(c.dir, uid, gid); err != nil {
		return err
	}
	return os.Chmod(c.dir, 0o755)
}

// run runs one of the server binaries, as the postgres user when needed.
func (c *cluster) run(name string, args ...string) error {
	return c.runPath(filepath.Join(c.bin, name), args...)
}

// runPath runs the server binary at path, as the postgres user when needed.
func (c *cluster) runPath(path string, args ...string) error {
	name := filepath.Base(path)
	var cmd *exec.Cmd
	if c.asUser {
		cmd = exec.Command("runuser", append([]string{"-u", "postgres", "--", path}, args...)...)
	} else {
		cmd = exec.Command(path, args...)
	}
	cmd.Dir = c.dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

// stop stops the cluster at once and removes its directory.
func (c *cluster) stop() {
	_ = c.run("pg_ctl", "stop", "-D", c.data(), "-m", "immediate", "-w", "-t", "30")
	os.RemoveAll(c.dir)
}

// removeStale stops and removes clusters whose test binary is gone.
func removeStale(bin string) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, dir := range dirs {
		raw, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			continue // being created right now, or not ours
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
		if err != nil || alive(pid) {
			continue
		}
		stale := &cluster{dir: dir, bin: bin, asUser: os.Geteuid() == 0}
		stale.stop()
	}
}

// alive reports whether process pid exists.
func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
