package lockhooks

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/tiedproc"
)

// Tests that need a second OS process, driven step by step, re-run this
// test binary as a child: TestHelperChild, on the database in envChildDSN
// (through a transaction pooler, with WithTransactionPooler, when
// envChildPooler is "transaction"). The child reads one command per line on
// its stdin and answers one line on its stdout. (TestHelperReplica, in
// pg_stress_test.go, is a child that runs on its own.)
const (
	envChildDSN    = "LOCKHOOKS_CHILD_DSN"
	envChildPooler = "LOCKHOOKS_CHILD_POOLER"
)

// child is a running child process.
type child struct {
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Scanner
	done <-chan struct{} // closed when the process has exited
}

// startChild starts this test binary as a child on the database dsn
// (through a transaction pooler when pooler is set). It is killed when t
// ends, and by the kernel if this process dies.
func startChild(t *testing.T, dsn string, pooler bool) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), envChildDSN+"="+dsn)
	if pooler {
		cmd.Env = append(cmd.Env, envChildPooler+"=transaction")
	}
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	proc, err := tiedproc.Start(cmd)
	if err != nil {
		t.Fatal(err)
	}
	h := &child{cmd: cmd, in: in, out: bufio.NewScanner(out), done: proc.Exited()}
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-h.done
	})
	return h
}

// ask sends the child a command and returns its answer, failing t if the
// child answers "error …", exits, or takes longer than a minute.
func (h *child) ask(t *testing.T, command string) string {
	t.Helper()
	if _, err := fmt.Fprintln(h.in, command); err != nil {
		t.Fatalf("child: sending %q: %v", command, err)
	}
	answer := make(chan string, 1)
	go func() {
		if h.out.Scan() {
			answer <- h.out.Text()
			return
		}
		close(answer)
	}()
	select {
	case a, ok := <-answer:
		if !ok {
			t.Fatalf("child: no answer to %q: it exited (%v)", command, h.out.Err())
		}
		if strings.HasPrefix(a, "error ") {
			t.Fatalf("child: %q: %s", command, a)
		}
		return a
	case <-time.After(time.Minute):
		t.Fatalf("child: no answer to %q within a minute", command)
	}
	return ""
}

// TestHelperChild is not a test: it is the child process the tests above
// start (it skips when run as a test). It opens the database of envChildDSN
// through lockhooks and runs the commands it reads:
//
//   - "hold K1 K2": AcquireAdvisoryLock(K1), then pg_advisory_lock(K2)
//     through the pool (a parked lock); answers "held" and keeps both until
//     the process ends;
//   - "token K": AcquireAdvisoryLock(K), Token, Release; answers the token.
func TestHelperChild(t *testing.T) {
	dsn := os.Getenv(envChildDSN)
	if dsn == "" {
		t.Skip("the child process of the tests that drive a second OS process")
	}
	var opts []Option
	if os.Getenv(envChildPooler) == "transaction" {
		opts = append(opts, WithTransactionPooler())
	}
	db, err := Open("pgx", dsn, opts...)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	ctx := context.Background()
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		fmt.Println(childCommand(ctx, db, in.Text()))
	}
	db.Close()
	os.Exit(0) // no test summary on stdout
}

// childCommand runs one command of TestHelperChild and returns its answer.
func childCommand(ctx context.Context, db *sql.DB, command string) string {
	var k1, k2 int64
	switch {
	case strings.HasPrefix(command, "hold "):
		if _, err := fmt.Sscan(command[len("hold "):], &k1, &k2); err != nil {
			return "error " + err.Error()
		}
		l, err := AcquireAdvisoryLock(ctx, db, k1)
		if err != nil {
			return "error " + err.Error()
		}
		if _, err := db.ExecContext(ctx, "SELECT pg_advisory_lock($1)", k2); err != nil {
			return "error " + err.Error()
		}
		_ = l // held until the process ends
		return "held"
	case strings.HasPrefix(command, "token "):
		if _, err := fmt.Sscan(command[len("token "):], &k1); err != nil {
			return "error " + err.Error()
		}
		l, err := AcquireAdvisoryLock(ctx, db, k1)
		if err != nil {
			return "error " + err.Error()
		}
		token := l.Token()
		if err := l.Release(ctx); err != nil {
			return "error " + err.Error()
		}
		return fmt.Sprint(token)
	}
	return "error unknown command " + command
}
