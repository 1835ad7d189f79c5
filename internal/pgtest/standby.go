package pgtest

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/lockhooks/lockhooks/internal/testcaps"
)

// StandbyDSN returns the DSN (a postgres:// URL, database "postgres") of a
// hot standby of the private cluster, made for t with pg_basebackup
// (streaming replication) and stopped and removed when t ends. It takes a
// few seconds. Without pg_basebackup beside initdb, or when the tests use an
// outside server (LOCKHOOKS_TEST_PG_DSN), it skips t with a loud message
// (fails it when LOCKHOOKS_REQUIRE_PG=1).
func StandbyDSN(t testing.TB) string {
	t.Helper()
	needServer(t)
	if server == nil {
		testcaps.Skip(t, testcaps.PostgreSQL, "a hot standby needs the private cluster; "+EnvDSN+" names an outside server")
	}
	basebackup, err := beside(server.bin, "pg_basebackup")
	if err != nil {
		testcaps.Skip(t, testcaps.PostgreSQL, "no pg_basebackup for a hot standby: "+err.Error())
	}
	dir, err := os.MkdirTemp("", dirPrefix+"standby-")
	if err != nil {
		t.Fatal(err)
	}
	s := &cluster{dir: dir, bin: server.bin, asUser: server.asUser}
	if err := s.claimDir(); err != nil {
		t.Fatalf("pgtest: the standby's directory: %v", err)
	}
	t.Cleanup(s.stop)
	if err := s.runPath(basebackup, "-h", "127.0.0.1", "-p", strconv.Itoa(server.port), "-U", "postgres",
		"-D", s.data(), "-R", "-X", "stream", "-c", "fast", "--no-sync"); err != nil {
		t.Fatalf("pgtest: pg_basebackup for a standby: %v", err)
	}
	// serve waits until the standby accepts read-only connections.
	if err := s.serve(); err != nil {
		t.Fatalf("pgtest: starting the standby: %v", err)
	}
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.port)
}

// beside returns the path of the server binary name that belongs to the
// initdb in binDir (binDir may hold symlinks to the version's own
// directory, as /usr/local/bin does on some machines).
func beside(binDir, name string) (string, error) {
	initdb, err := filepath.EvalSymlinks(filepath.Join(binDir, "initdb"))
	if err != nil {
		return "", err
	}
	for _, dir := range []string{binDir, filepath.Dir(initdb)} {
		if p := filepath.Join(dir, name); fileExists(p) {
			return p, nil
		}
	}
	return "", fmt.Errorf("neither %s nor %s holds %s", binDir, filepath.Dir(initdb), name)
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
