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

// testChild is this test binary running one of its tests (a child's side)
// as a child process, with an environment that tells it what to do. It is
// tied to this process (the kernel kills it if this one dies), its stdout
// comes a line at a time, its stderr is kept for failure messages, and
// when the test ends its stdin is closed (the child ends its work and
// exits), and it is killed if it has not exited within 30 s.
type testChild struct {
	cmd    *exec.Cmd
	proc   *tiedproc.Process
	stdin  io.WriteCloser
	lines  chan string // its stdout, a line each; closed when it closes
	stderr syncBuffer
}

// startTestChild starts this test binary running only the test named run,
// with env added to this process's environment.
func startTestChild(t *testing.T, run string, env ...string) *testChild {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+run+"$", "-test.count=1", "-test.timeout=5m")
	cmd.Env = append(os.Environ(), env...)
	ch := &testChild{cmd: cmd, lines: make(chan string, 16)}
	cmd.Stderr = &ch.stderr
	var err error
	if ch.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if ch.proc, err = tiedproc.Start(cmd); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			ch.lines <- sc.Text()
		}
		close(ch.lines)
	}()
	t.Cleanup(func() {
		ch.stdin.Close()
		select {
		case <-ch.proc.Exited():
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-ch.proc.Exited()
			t.Errorf("the child running %s did not exit within 30 s of its input's end:\n%s", run, ch.stderr.String())
		}
	})
	return ch
}

// line returns the child's next line of stdout, failing t if the child
// closes its stdout (it exited) first or says nothing within limit; what
// names the line awaited, for the message.
func (ch *testChild) line(t *testing.T, what string, limit time.Duration) string {
	t.Helper()
	select {
	case line, ok := <-ch.lines:
		if !ok {
			<-ch.proc.Exited()
			t.Fatalf("the child exited (%v) before %s:\n%s", ch.proc.Err(), what, ch.stderr.String())
		}
		return line
	case <-time.After(limit):
		t.Fatalf("no %s from the child within %v:\n%s", what, limit, ch.stderr.String())
	}
	return ""
}

// child is a TestHelperChild process: it answers a command per line.
type child struct{ *testChild }

// startChild starts TestHelperChild on the database dsn (through a
// transaction pooler when pooler is set).
func startChild(t *testing.T, dsn string, pooler bool) *child {
	t.Helper()
	return &child{startTestChild(t, "TestHelperChild", childDBEnv(dsn, pooler)...)}
}

// childDBEnv is the environment that tells a child which database to open
// (openChildDB): dsn, through a transaction pooler when pooler is set.
func childDBEnv(dsn string, pooler bool) []string {
	env := []string{envChildDSN + "=" + dsn}
	if pooler {
		env = append(env, envChildPooler+"=transaction")
	}
	return env
}

// openChildDB opens, on a child's side, the database its parent named with
// childDBEnv, through lockhooks.
func openChildDB() (*sql.DB, error) {
	var opts []Option
	if os.Getenv(envChildPooler) == "transaction" {
		opts = append(opts, WithTransactionPooler())
	}
	return Open("pgx", os.Getenv(envChildDSN), opts...)
}

// ask sends the child a command and returns its answer, failing t if the
// child answers "error …", exits, or takes longer than a minute.
func (h *child) ask(t *testing.T, command string) string {
	t.Helper()
	if _, err := fmt.Fprintln(h.stdin, command); err != nil {
		t.Fatalf("child: sending %q: %v", command, err)
	}
	a := h.line(t, fmt.Sprintf("answer to %q", command), time.Minute)
	if strings.HasPrefix(a, "error ") {
		t.Fatalf("child: %q: %s", command, a)
	}
	return a
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
	if os.Getenv(envChildDSN) == "" {
		t.Skip("the child process of the tests that drive a second OS process")
	}
	db, err := openChildDB()
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
