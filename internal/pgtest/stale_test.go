package pgtest

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/lockhooks/lockhooks/internal/testcaps"
)

// A test binary killed mid-run leaves its cluster running; the next one must
// stop and remove it.
func TestStaleClusterIsRemoved(t *testing.T) {
	if _, err := findBin(); err != nil {
		testcaps.Skip(t, testcaps.PostgreSQL, err.Error())
	}
	c, err := startCluster()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.stop)

	// Pretend the binary that started it was killed: point its owner file at
	// a process that has exited.
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(c.dir, ownerFile), []byte(strconv.Itoa(dead.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}

	removeStale(c.bin)

	if _, err := os.Stat(c.dir); !os.IsNotExist(err) {
		t.Errorf("stale cluster directory %s still exists (stat: %v)", c.dir, err)
	}
	if conn, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(c.port)); err == nil {
		conn.Close()
		t.Errorf("the stale cluster still listens on port %d", c.port)
	}
}

// A cluster whose test binary still runs is left alone.
func TestLiveClusterIsKept(t *testing.T) {
	dir := t.TempDir()
	own := filepath.Join(os.TempDir(), dirPrefix+"live-"+filepath.Base(dir))
	if err := os.Mkdir(own, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(own) })
	if err := os.WriteFile(filepath.Join(own, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		t.Fatal(err)
	}
	removeStale("/nonexistent")
	if _, err := os.Stat(own); err != nil {
		t.Errorf("a live owner's cluster directory was removed: %v", err)
	}
}
