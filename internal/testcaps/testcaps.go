package testcaps

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
	"testing"
)

// A Capability is something on the machine some tests need.
type Capability struct {
	Name    string // "Chromium"
	Tests   string // what goes untested without it
	Enable  string // how to provide it
	Require string // the variable that makes its absence a failure (=1)
}

// The capabilities lockhooks' tests use.
var (
	PostgreSQL = Capability{Name: "PostgreSQL", Tests: "every Postgres test (advisory locks, pinning, row-lock rewrite, blockers)",
		Enable:  "install PostgreSQL's server binaries (initdb and pg_ctl on PATH or under /usr/lib/postgresql/*/bin; Debian: apt-get install postgresql), or set LOCKHOOKS_TEST_PG_DSN=postgres://… to a server whose user may create databases",
		Require: "LOCKHOOKS_REQUIRE_PG"}
	PgBouncer = Capability{Name: "PgBouncer", Tests: "the transaction-pooler tests",
		Enable: "install PgBouncer (Debian: apt-get install pgbouncer)", Require: "LOCKHOOKS_REQUIRE_PGBOUNCER"}
	Chromium = Capability{Name: "Chromium", Tests: "the /debug/locks page in a real headless browser (layout, size, screenshots)",
		Enable: "install Chromium (Debian: apt-get install chromium), or set LOCKHOOKS_CHROMIUM=/path/to/chrome", Require: "LOCKHOOKS_REQUIRE_BROWSER"}
	Prometheus = Capability{Name: "Prometheus", Tests: "the dashboards' queries and alert rules against a real Prometheus",
		Enable: "install Prometheus and promtool (Debian: apt-get install prometheus)", Require: "LOCKHOOKS_REQUIRE_PROMETHEUS"}
)

var (
	mu      sync.Mutex
	missing = map[string]*miss{}
)

// miss is what one capability's absence cost this test binary.
type miss struct {
	c     Capability
	why   string
	tests []string
}

// Skip skips t because c is missing (why says what was looked for), or
// fails it when c's LOCKHOOKS_REQUIRE_* variable is 1; the skip is
// counted for [Report].
func Skip(t testing.TB, c Capability, why string) {
	t.Helper()
	if os.Getenv(c.Require) == "1" {
		t.Fatalf("%s is required (%s=1) but unavailable: %s", c.Name, c.Require, why)
	}
	note(t, c, why)
	t.Skipf("\n*** SKIPPING: %s unavailable: %s.\n*** Not tested: %s.\n*** To test it: %s; %s=1 makes this a failure (CI sets it).",
		c.Name, why, c.Tests, c.Enable, c.Require)
}

// Missing records that t ran without c (it tested what it could), or
// fails it when c's LOCKHOOKS_REQUIRE_* variable is 1.
func Missing(t testing.TB, c Capability, why string) {
	t.Helper()
	if os.Getenv(c.Require) == "1" {
		t.Fatalf("%s is required (%s=1) but unavailable: %s", c.Name, c.Require, why)
	}
	note(t, c, why)
	t.Logf("*** WITHOUT %s (%s): not tested: %s. To test it: %s.", c.Name, why, c.Tests, c.Enable)
}

func note(t testing.TB, c Capability, why string) {
	mu.Lock()
	defer mu.Unlock()
	m := missing[c.Name]
	if m == nil {
		m = &miss{c: c, why: why}
		missing[c.Name] = m
	}
	m.tests = append(m.tests, t.Name())
}

// FindChromium returns the headless browser to drive: LOCKHOOKS_CHROMIUM,
// or chromium (or Chrome) on PATH.
func FindChromium() (string, error) {
	candidates := []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"}
	if p := os.Getenv("LOCKHOOKS_CHROMIUM"); p != "" {
		candidates = []string{p}
	}
	for _, c := range candidates {
		if p, err := exec.LookPath(c); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("no %s on PATH", strings.Join(candidates, ", "))
}

// NeedChromium returns the browser, or skips t (see [Skip]).
func NeedChromium(t testing.TB) string {
	t.Helper()
	p, err := FindChromium()
	if err != nil {
		Skip(t, Chromium, err.Error())
	}
	return p
}

// Main runs the tests, reports what they skipped, and exits: use it as
// TestMain in packages whose TestMain is not pgtest.Main.
func Main(m *testing.M) {
	code := m.Run()
	Report()
	os.Exit(code)
}

// Report writes what this test binary did not test, if anything, where the
// go command shows it (see the package comment). Call it after m.Run.
func Report() {
	text := report()
	if text == "" {
		return
	}
	w, done := reportWriter()
	defer done()
	io.WriteString(w, text) // one write: a pipe keeps it whole (< PIPE_BUF)
}

// report formats the missing capabilities, "" when nothing was skipped.
func report() string {
	mu.Lock()
	defer mu.Unlock()
	if len(missing) == 0 {
		return ""
	}
	names := make([]string, 0, len(missing))
	for n := range missing {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	fmt.Fprintf(&b, "--- NOT TESTED in %s (it passed without them):\n", packagePath())
	for _, n := range names {
		m := missing[n]
		fmt.Fprintf(&b, "    %s: %s (%d %s, e.g. %s); not tested: %s.\n      To test it: %s. %s=1 makes its absence a failure.\n",
			n, m.why, len(m.tests), plural(len(m.tests), "test", "tests"), m.tests[0], m.c.Tests, m.c.Enable, m.c.Require)
	}
	s := b.String()
	if len(s) > 4000 {
		s = s[:3996] + "…\n"
	}
	return s
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// packagePath is the import path of the package under test.
func packagePath() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Path != "" {
		return strings.TrimSuffix(bi.Path, ".test")
	}
	return "this package"
}

// reportWriter returns where the report goes: the test's standard output
// when the go command shows it (-v, -json) or when no go command captures
// it, else the go command's own standard output or the terminal.
func reportWriter() (io.Writer, func()) {
	if testing.Verbose() || !underGoTest() {
		return os.Stdout, func() {}
	}
	if f := goCommandOutput(); f != nil {
		return f, func() { f.Close() }
	}
	return os.Stdout, func() {}
}

// underGoTest reports whether the go command runs this binary (it always
// passes -test.paniconexit0).
func underGoTest() bool {
	for _, a := range os.Args[1:] {
		if strings.HasPrefix(a, "-test.paniconexit0") {
			return true
		}
	}
	return false
}

// Forget drops what tests whose names begin with prefix noted: for a test
// that makes a capability look missing on purpose, to test the skip.
func Forget(prefix string) {
	mu.Lock()
	defer mu.Unlock()
	for n, m := range missing {
		kept := m.tests[:0]
		for _, t := range m.tests {
			if !strings.HasPrefix(t, prefix) {
				kept = append(kept, t)
			}
		}
		if m.tests = kept; len(kept) == 0 {
			delete(missing, n)
		}
	}
}
