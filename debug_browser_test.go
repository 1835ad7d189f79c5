package lockhooks

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Environment of the real-browser tests.
const (
	// envRequireBrowser=1 makes a missing Chromium a failure (CI sets it).
	envRequireBrowser = "LOCKHOOKS_REQUIRE_BROWSER"
	// envChromium names the browser binary, if not chromium on PATH.
	envChromium = "LOCKHOOKS_CHROMIUM"
	// envScreenshots, if set, is a directory the screenshots are copied to.
	envScreenshots = "LOCKHOOKS_SCREENSHOTS"
)

// chromium returns the headless browser to drive, or skips the test
// loudly (fails under LOCKHOOKS_REQUIRE_BROWSER=1).
func chromium(t *testing.T) string {
	t.Helper()
	candidates := []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"}
	if p := os.Getenv(envChromium); p != "" {
		candidates = []string{p}
	}
	for _, c := range candidates {
		if p, err := exec.LookPath(c); err == nil {
			return p
		}
	}
	msg := "\n*** SKIPPING THE REAL-BROWSER TEST: no Chromium found (tried " + strings.Join(candidates, ", ") + ").\n" +
		"*** Install it (apt-get install chromium chromium-driver) or set " + envChromium + ";\n" +
		"*** " + envRequireBrowser + "=1 makes this a failure (CI sets it).\n"
	if os.Getenv(envRequireBrowser) == "1" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// browser runs headless Chromium on url and returns what it printed.
func browser(t *testing.T, bin string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	all := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--no-first-run", "--disable-extensions", "--hide-scrollbars",
		"--user-data-dir=" + t.TempDir()}, args...)
	cmd := exec.CommandContext(ctx, bin, all...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s", bin, strings.Join(all, " "), err, stderr.String())
	}
	return stdout.String()
}

// renderedDOM loads the page in the browser, lets its script run, and
// returns the DOM as the browser built it. The script, allowed by the
// page's CSP nonce, marks the document when it schedules the reload.
func renderedDOM(t *testing.T, bin, url string) string {
	t.Helper()
	dom := browser(t, bin, "--virtual-time-budget=1000", "--dump-dom", url+"?refresh=30")
	if !strings.Contains(dom, `data-reload="scheduled"`) {
		t.Errorf("the page's script did not run (no reload scheduled):\n%s", dom)
	}
	return dom
}

// screenshot saves the page at a window width under the test's temp dir
// (and under LOCKHOOKS_SCREENSHOTS if set).
func screenshot(t *testing.T, bin, url, name string, width int) {
	t.Helper()
	file := filepath.Join(t.TempDir(), name)
	browser(t, bin, "--virtual-time-budget=2000", fmt.Sprintf("--window-size=%d,1000", width), "--screenshot="+file, url)
	st, err := os.Stat(file)
	if err != nil || st.Size() == 0 {
		t.Fatalf("no screenshot at %s: %v", file, err)
	}
	t.Logf("screenshot (%dpx wide): %s", width, file)
	if dir := os.Getenv(envScreenshots); dir != "" {
		b, err := os.ReadFile(file)
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, name), b, 0o644)
		}
		if err != nil {
			t.Errorf("copying the screenshot: %v", err)
		}
	}
}

// element returns the start tag in dom that begins with prefix, or "".
func element(dom, prefix string) string {
	i := strings.Index(dom, prefix)
	if i < 0 {
		return ""
	}
	j := strings.IndexByte(dom[i:], '>')
	if j < 0 {
		return ""
	}
	return dom[i : i+j+1]
}

// SQLite: one connection holds an advisory lock, another waits for it.
// Chromium renders the page: the held lock's row, the waiter's row and
// the SVG edge from the waiter to the holder are in the DOM it built.
func TestDebugPageInBrowserSQLite(t *testing.T) {
	bin := chromium(t)
	db := openSQLite(t)
	ctx := context.Background()
	srv := httptest.NewServer(DebugHandler(db))
	defer srv.Close()

	held, err := AcquireAdvisoryLock(ctx, db, 4242)
	if err != nil {
		t.Fatal(err)
	}
	holder := trackedConn(t, held.Conn())
	waitCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := AcquireAdvisoryLock(waitCtx, db, 4242)
		done <- err
	}()
	rep, _ := waitForWaiters(t, srv, 1)
	waiter := rep.Databases[0].Waiters[0].Conn

	dom := renderedDOM(t, bin, srv.URL)
	assertRendered(t, dom, holder.id, "4242", waiter, fmt.Sprintf("conn-%d", holder.id))
	screenshot(t, bin, srv.URL+"?refresh=0", "sqlite-wide.png", 1280)
	screenshot(t, bin, srv.URL+"?refresh=0", "sqlite-narrow.png", 420)

	cancel()
	<-done
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// Postgres: a backend of another process holds the lock a lockhooks
// connection waits for, and a lockhooks connection holds a lock another
// waits for. The DOM shows both rows and both edges, the blocker's pid
// and application_name.
func TestDebugPageInBrowserPostgres(t *testing.T) {
	bin := chromium(t)
	e := newPinEnv(t)
	ctx := context.Background()
	srv := httptest.NewServer(DebugHandler(e.wrapped))
	defer srv.Close()
	blocker, pid := rawBlocker(t, e.raw, 7201, "s3cret-browser-argument")
	defer blocker.Close()

	held, err := AcquireAdvisoryLock(ctx, e.wrapped, 7202)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	holder := trackedConn(t, held.Conn())
	waitCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 2)
	for _, k := range []int64{7201, 7202} {
		go func() {
			_, err := AcquireAdvisoryLock(waitCtx, e.wrapped, k)
			done <- err
		}()
	}
	var inProcess, crossProcess uint64
	waitFor(t, 15*time.Second, "both waiters and the blocker on the page", func() bool {
		rep, _ := debugJSON(t, srv)
		inProcess, crossProcess = 0, 0
		for _, w := range rep.Databases[0].Waiters {
			switch {
			case w.Keys == "7202" && len(w.Holders) > 0:
				inProcess = w.Conn
			case w.Keys == "7201" && len(w.Blockers) > 0:
				crossProcess = w.Conn
			}
		}
		return inProcess != 0 && crossProcess != 0
	})

	dom := renderedDOM(t, bin, srv.URL)
	assertRendered(t, dom, holder.id, "7202", inProcess, fmt.Sprintf("conn-%d", holder.id))
	assertRendered(t, dom, holder.id, "7202", crossProcess, fmt.Sprintf("pid-%d", pid))
	if !strings.Contains(dom, fmt.Sprintf(`<li class="blocker" data-pid="%d">`, pid)) || !strings.Contains(dom, "lockhooks_debug_blocker") {
		t.Errorf("the blocker (pid %d) is not rendered", pid)
	}
	if strings.Contains(dom, "s3cret-browser-argument") {
		t.Error("an argument is rendered")
	}
	screenshot(t, bin, srv.URL+"?refresh=0", "postgres-wide.png", 1280)
	screenshot(t, bin, srv.URL+"?refresh=0", "postgres-narrow.png", 420)
	cancel()
	<-done
	<-done
}

// assertRendered checks the DOM for the held lock's row, the waiter's row
// and the edge from the waiter to node to.
func assertRendered(t *testing.T, dom string, holder uint64, key string, waiter uint64, to string) {
	t.Helper()
	if row := element(dom, fmt.Sprintf(`<tr class="held-lock" data-conn="%d" data-key="%s"`, holder, key)); row == "" {
		t.Errorf("no row for lock %s held by connection #%d in the rendered DOM:\n%s", key, holder, dom)
	}
	if row := element(dom, fmt.Sprintf(`<tr class="waiter" data-conn="%d"`, waiter)); row == "" {
		t.Errorf("no row for the waiter #%d in the rendered DOM", waiter)
	}
	edge := element(dom, fmt.Sprintf(`<line class="edge" data-from="conn-%d" data-to="%s"`, waiter, to))
	if edge == "" || !strings.Contains(edge, `marker-end="url(#lh-arrow)"`) {
		t.Errorf("no SVG edge conn-%d -> %s in the rendered DOM: %q", waiter, to, edge)
	}
	if !strings.Contains(dom, `<svg class="graph"`) {
		t.Error("no graph rendered")
	}
}
