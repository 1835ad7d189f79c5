package testcaps

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// The README's test command, run without -v on a machine without
// Chromium (hidden from PATH, LOCKHOOKS_REQUIRE_BROWSER unset), passes and
// says what it did not test and how to test it; with -v it says it once.
func TestReportShownByGoTest(t *testing.T) {
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goBin); err != nil {
		if goBin, err = exec.LookPath("go"); err != nil {
			t.Skipf("no go command to run: %v", err)
		}
	}
	var env []string
	for _, kv := range os.Environ() {
		switch k, _, _ := strings.Cut(kv, "="); k {
		case "PATH", "LOCKHOOKS_REQUIRE_BROWSER", "LOCKHOOKS_CHROMIUM", "GOFLAGS":
			continue
		}
		env = append(env, kv)
	}
	env = append(env, "PATH="+t.TempDir(), "CGO_ENABLED=0") // no browser anywhere
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(goBin, append([]string{"test", "-count=1"}, append(args, "./testdata/skipper")...)...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go test %v failed (it must pass without Chromium): %v\n%s", args, err, out)
		}
		return string(out)
	}

	out := run()
	t.Logf("go test ./testdata/skipper:\n%s", out)
	for _, want := range []string{
		"NOT TESTED in github.com/lockhooks/lockhooks/internal/testcaps/testdata/skipper",
		"Chromium: no chromium", "1 test, e.g. TestNeedsChromium",
		"apt-get install chromium", "LOCKHOOKS_CHROMIUM", "LOCKHOOKS_REQUIRE_BROWSER=1",
		"ok  \tgithub.com/lockhooks/lockhooks/internal/testcaps/testdata/skipper",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the output lacks %q", want)
		}
	}
	if strings.Contains(out, "Chromium found") {
		t.Error("the test found a Chromium that PATH hides")
	}

	out = run("-v")
	if n := strings.Count(out, "NOT TESTED in"); n != 1 {
		t.Errorf("with -v the report appears %d times, want once:\n%s", n, out)
	}
}

// Nothing skipped, nothing reported.
func TestReportEmpty(t *testing.T) {
	mu.Lock()
	saved := missing
	missing = map[string]*miss{}
	mu.Unlock()
	defer func() { mu.Lock(); missing = saved; mu.Unlock() }()
	if s := report(); s != "" {
		t.Errorf("report %q", s)
	}
}
