package lockhooks

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/debugpage"
	"github.com/lockhooks/lockhooks/internal/testcaps"
)

// The real-browser tests drive headless Chromium (skipped loudly without
// it, failing under LOCKHOOKS_REQUIRE_BROWSER=1; LOCKHOOKS_CHROMIUM names
// the binary). LOCKHOOKS_SCREENSHOTS=dir keeps their screenshots.
const envScreenshots = "LOCKHOOKS_SCREENSHOTS"

// browser runs headless Chromium with args and returns what it printed.
func browser(t *testing.T, bin string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	all := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--no-first-run", "--disable-extensions", "--hide-scrollbars", "--force-device-scale-factor=1",
		"--user-data-dir=" + t.TempDir()}, args...)
	cmd := exec.CommandContext(ctx, bin, all...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s", bin, strings.Join(all, " "), err, stderr.String())
	}
	return stdout.String()
}

// screenshot saves the page at a window width under the test's temp dir
// (and under LOCKHOOKS_SCREENSHOTS if set).
func screenshot(t *testing.T, bin, url, name string, width int) {
	t.Helper()
	file := filepath.Join(t.TempDir(), name)
	browser(t, bin, "--virtual-time-budget=2000", fmt.Sprintf("--window-size=%d,2400", width), "--screenshot="+file, url)
	st, err := os.Stat(file)
	if err != nil || st.Size() == 0 {
		t.Fatalf("no screenshot at %s: %v", file, err)
	}
	if dir := os.Getenv(envScreenshots); dir != "" {
		b, err := os.ReadFile(file)
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, name), b, 0o644)
		}
		if err != nil {
			t.Errorf("copying the screenshot: %v", err)
		}
		file = filepath.Join(dir, name)
	}
	t.Logf("screenshot (%dpx wide): %s", width, file)
}

// pageCheck is what checkScript measures in the rendered page.
type pageCheck struct {
	Width        int      `json:"width"`       // the window's inner width
	ScrollWidth  int      `json:"scrollWidth"` // the document's: wider means a horizontal scroll bar
	Cells        int      `json:"cells"`
	Words        int      `json:"words"`
	Broken       []string `json:"broken"`       // words a line break cuts, with their cell's text
	NumNotRight  []string `json:"numNotRight"`  // numeric cells not right-aligned
	FirstWaitTop float64  `json:"firstWaitTop"` // where the first wait row is (-1: none)
	FirstHeldTop float64  `json:"firstHeldTop"` // where the first held-lock row is (-1: none)
	WaitsFirst   bool     `json:"waitsFirst"`   // the first wait row comes before the first held row
	ScriptRan    bool     `json:"scriptRan"`    // the page's own script ran (under its CSP)
	LoadMS       float64  `json:"loadMs"`       // navigation start to load, as the browser timed it
}

// checkScript runs in the page once it has loaded, and writes a pageCheck
// into <html data-check>. A word (letters, digits, _) that the layout
// cuts across lines has boxes on more than one line.
const checkScript = `
(function () {
  function run() {
    var out = {width: window.innerWidth, scrollWidth: document.documentElement.scrollWidth, cells: 0, words: 0,
      broken: [], numNotRight: [], firstWaitTop: -1, firstHeldTop: -1, waitsFirst: false,
      scriptRan: document.documentElement.getAttribute("data-reload") === "scheduled",
      loadMs: performance.getEntriesByType("navigation")[0].loadEventStart};
    var word = /[\p{L}\p{N}_]{2,}/gu;
    document.querySelectorAll("td, th").forEach(function (cell) {
      if (cell.getClientRects().length === 0) return;
      out.cells++;
      var walk = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT), n;
      while ((n = walk.nextNode())) {
        var m;
        word.lastIndex = 0;
        while ((m = word.exec(n.nodeValue)) !== null) {
          out.words++;
          var r = document.createRange();
          r.setStart(n, m.index);
          r.setEnd(n, m.index + m[0].length);
          var tops = {};
          Array.prototype.forEach.call(r.getClientRects(), function (b) { if (b.width > 0) tops[Math.round(b.top)] = true; });
          if (Object.keys(tops).length > 1) out.broken.push(m[0] + " in: " + cell.textContent.trim().slice(0, 80));
        }
      }
    });
    document.querySelectorAll("td.num").forEach(function (c) {
      if (getComputedStyle(c).textAlign !== "right") out.numNotRight.push(c.textContent.trim());
    });
    var w = document.querySelector("tr.summary-wait, tr.waiter"), h = document.querySelector("tr.held-lock");
    if (w) out.firstWaitTop = w.getBoundingClientRect().top + window.scrollY;
    if (h) out.firstHeldTop = h.getBoundingClientRect().top + window.scrollY;
    out.waitsFirst = !!(w && h && (w.compareDocumentPosition(h) & Node.DOCUMENT_POSITION_FOLLOWING));
    document.documentElement.setAttribute("data-check", JSON.stringify(out));
  }
  if (document.readyState === "complete") setTimeout(run, 0); else window.addEventListener("load", function () { setTimeout(run, 0); });
})();
`

var nonceRE = regexp.MustCompile(`'nonce-([^']+)'`)

// checkingProxy serves h's page with checkScript added under the page's
// own CSP nonce: the page is measured as served, its CSP in force.
func checkingProxy(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		body := rec.Body.String()
		if m := nonceRE.FindStringSubmatch(rec.Header().Get("Content-Security-Policy")); m != nil {
			body = strings.Replace(body, "</body>", `<script nonce="`+m[1]+`">`+checkScript+"</script></body>", 1)
		}
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		io.WriteString(w, body)
	})
}

var checkRE = regexp.MustCompile(`data-check="([^"]*)"`)

// checkPage renders the page at a window width in Chromium and returns
// what checkScript measured; it fails the test on words cut mid-word, a
// page wider than the window and numeric cells not right-aligned.
func checkPage(t *testing.T, bin string, h http.Handler, width int) pageCheck {
	t.Helper()
	srv := httptest.NewServer(checkingProxy(h))
	defer srv.Close()
	start := time.Now()
	dom := browser(t, bin, "--virtual-time-budget=3000", fmt.Sprintf("--window-size=%d,1000", width), "--dump-dom", srv.URL+"?refresh=30")
	wall := time.Since(start)
	m := checkRE.FindStringSubmatch(dom)
	if m == nil {
		t.Fatalf("the check did not run in the page:\n%.3000s", dom)
	}
	var c pageCheck
	if err := json.Unmarshal([]byte(html.UnescapeString(m[1])), &c); err != nil {
		t.Fatalf("%v: %s", err, m[1])
	}
	t.Logf("Chromium at %dpx: %d cells, %d words checked; loaded in %.0f ms (browser), %v for the whole headless run", width, c.Cells, c.Words, c.LoadMS, wall.Round(time.Millisecond))
	if c.Width < width-40 || c.Width > width {
		t.Errorf("the window is %dpx wide, want about %d", c.Width, width)
	}
	if len(c.Broken) > 0 {
		t.Errorf("at %dpx, %d words are broken mid-word, e.g.:\n  %s", width, len(c.Broken), strings.Join(c.Broken[:min(10, len(c.Broken))], "\n  "))
	}
	if c.ScrollWidth > c.Width {
		t.Errorf("at %dpx the page is %dpx wide: it scrolls sideways", width, c.ScrollWidth)
	}
	if len(c.NumNotRight) > 0 {
		t.Errorf("numeric cells not right-aligned: %q", c.NumNotRight)
	}
	if !c.ScriptRan {
		t.Error("the page's own script did not run under its CSP")
	}
	return c
}

// incident is a database in trouble: many locks held, many waiters.
type incident struct {
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	errs    chan error
	cleanup []func()
}

// end stops the waiters (their waits fail with the context's error) and
// releases what the holders hold.
func (in *incident) end(t *testing.T) {
	t.Helper()
	in.cancel()
	in.wg.Wait()
	close(in.errs)
	for err := range in.errs {
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("a waiter: %v", err)
		}
	}
	for i := len(in.cleanup) - 1; i >= 0; i-- {
		in.cleanup[i]()
	}
}

// sqliteIncident holds 500 locks on db (440 ids of "invoices" and 59 of
// "orders" in two read-only transactions, and the advisory lock
// LockID("nightly-report")) and starts 60 waiters (50 for invoices, 9 for
// orders, 1 for the advisory lock), and waits until the page shows them.
func sqliteIncident(t *testing.T, db *sql.DB, h http.Handler) *incident {
	t.Helper()
	ctx := context.Background()
	in := &incident{errs: make(chan error, 64)}
	hold := func(ns string, n int) {
		tx, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		in.cleanup = append(in.cleanup, func() { tx.Rollback() })
		ids := make([]any, n)
		for i := range ids {
			ids[i] = i + 1
		}
		if err := Lock(ctx, tx, ns, ids...); err != nil {
			t.Fatal(err)
		}
	}
	hold("invoices", 440)
	hold("orders", 59)
	adv, err := AcquireAdvisoryLock(ctx, db, LockID("nightly-report"))
	if err != nil {
		t.Fatal(err)
	}
	in.cleanup = append(in.cleanup, func() { adv.Release(ctx) })

	waitCtx, cancel := context.WithCancel(ctx)
	in.cancel = cancel
	wait := func(ns string, id int) {
		defer in.wg.Done()
		tx, err := db.BeginTx(waitCtx, &sql.TxOptions{ReadOnly: true})
		if err != nil {
			in.errs <- err
			return
		}
		defer tx.Rollback()
		in.errs <- Lock(waitCtx, tx, ns, id)
	}
	for i := range 50 {
		in.wg.Add(1)
		go wait("invoices", 1+i%7) // a few hot ids
	}
	for i := range 9 {
		in.wg.Add(1)
		go wait("orders", 1+i)
	}
	in.wg.Add(1)
	go func() {
		defer in.wg.Done()
		_, err := AcquireAdvisoryLock(waitCtx, db, LockID("nightly-report"))
		in.errs <- err
	}()
	waitFor(t, 30*time.Second, "60 waiters and 500 held locks on the page", func() bool {
		rep := reportOf(t, h)
		return len(rep.Databases) > 0 && rep.Databases[0].WaitersTotal == 60 && rep.Databases[0].HeldTotal == 500
	})
	return in
}

// reportOf asks h for its JSON.
func reportOf(t testing.TB, h http.Handler) debugpage.Report {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/debug/locks?format=json", nil))
	var rep debugpage.Report
	if err := json.Unmarshal(rec.Body.Bytes(), &rep); err != nil {
		t.Fatalf("%v\n%.2000s", err, rec.Body.String())
	}
	return rep
}

// pageOf asks h for its HTML.
func pageOf(t testing.TB, h http.Handler, query string) string {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/debug/locks"+query, nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("%d: %s", rec.Code, rec.Body.String())
	}
	return rec.Body.String()
}

// An incident on SQLite, as the on-call engineer opens the page: 500
// locks held and 60 waiters. The HTML stays well under 200 KB; in
// Chromium, at 1000 and 1600 px, the waits come before the held locks and
// within the first screen, the locks are named and grouped ("and 420
// more"), no word is cut and the numeric columns are right-aligned.
func TestDebugPageInBrowserSQLiteIncident(t *testing.T) {
	bin := testcaps.NeedChromium(t)
	quiet := openSQLite(t) // a second database, with nothing going on
	db := openSQLite(t, WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))), WithSlowLockLog(200*time.Millisecond))
	h := DebugHandler(quiet, db)
	in := sqliteIncident(t, db, DebugHandler(db))
	defer in.end(t)

	page := pageOf(t, h, "?refresh=0")
	t.Logf("the page is %d bytes of HTML for 500 held locks and 60 waiters", len(page))
	if len(page) > 150<<10 {
		t.Errorf("the page is %d bytes; want well under 200 KB", len(page))
	}
	for _, want := range []string{"Summary: 60 waiting, 500 held", "Longest waits", "Holders blocking the most waiters",
		"nightly-report", "invoices", "440 held", "and 420 more", "59 held", "waiters</text>"} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	if strings.Index(page, `id="db-1"`) > strings.Index(page, `id="db-0"`) {
		t.Error("the busy database is not listed before the quiet one")
	}
	if n := strings.Count(page, `<tr class="held-lock"`); n > debugpage.ViewHeldRows {
		t.Errorf("%d held rows on the page", n)
	}

	for _, width := range []int{1000, 1600} {
		c := checkPage(t, bin, h, width)
		if !c.WaitsFirst || c.FirstWaitTop < 0 || c.FirstWaitTop > 900 {
			t.Errorf("at %dpx the first wait is at y=%.0f (held rows at %.0f): the waits must open the page", width, c.FirstWaitTop, c.FirstHeldTop)
		}
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	screenshot(t, bin, srv.URL+"?refresh=0", "sqlite-incident-1000.png", 1000)
	screenshot(t, bin, srv.URL+"?refresh=0", "sqlite-incident-1600.png", 1600)
}

// Postgres, the page opened during an incident: a key made with LockID
// and the keys of Lock, taken before the handler existed, are shown by
// name (Lock's as its namespace and id), held and waited for.
func TestDebugPageInBrowserPostgresNames(t *testing.T) {
	bin := testcaps.NeedChromium(t)
	e := newPinEnv(t)
	ctx := context.Background()
	blocker, pid := rawBlocker(t, e.raw, LockID("payroll-export"), "s3cret-browser-argument")
	defer blocker.Close()

	report, err := AcquireAdvisoryLock(ctx, e.wrapped, LockID("nightly-report"))
	if err != nil {
		t.Fatal(err)
	}
	defer report.Release(ctx)
	tx, err := e.wrapped.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := Lock(ctx, tx, "invoices", 42, 43); err != nil {
		t.Fatal(err)
	}
	waitCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 3)
	for _, name := range []string{"nightly-report", "payroll-export"} {
		go func() {
			_, err := AcquireAdvisoryLock(waitCtx, e.wrapped, LockID(name))
			done <- err
		}()
	}
	go func() {
		tx, err := e.wrapped.BeginTx(waitCtx, nil)
		if err == nil {
			err = Lock(waitCtx, tx, "invoices", 42)
			tx.Rollback()
		}
		done <- err
	}()

	h := DebugHandler(e.wrapped) // opened during the incident
	var rep debugpage.Report
	waitFor(t, 15*time.Second, "three waiters, each with its holder named (a connection of the process, or the outside backend)", func() bool {
		rep = reportOf(t, h)
		named, outside := 0, 0
		for _, w := range rep.Databases[0].Waiters {
			if len(w.Holders)+len(w.Blockers) > 0 {
				named++
			}
			if len(w.Blockers) > 0 {
				outside++
			}
		}
		return len(rep.Databases[0].Waiters) == 3 && named == 3 && outside == 1
	})
	d := rep.Databases[0]
	var named, lockset int
	for _, h := range d.Held {
		switch {
		case h.Kind == "advisory" && h.Name == "nightly-report" && h.Key == fmt.Sprint(LockID("nightly-report")) && h.Site != "":
			named++
		case h.Kind == "lockset" && h.Namespace == "invoices" && (h.Key == "42" || h.Key == "43") && h.AdvisoryKey != "" && h.Site != "" && !h.Since.IsZero():
			lockset++
		}
	}
	if named != 1 || lockset != 2 {
		t.Errorf("held (want nightly-report by name, invoices 42 and 43 as Lock's, with sites and ages): %+v", d.Held)
	}
	var keys []string
	for _, w := range d.Waiters {
		keys = append(keys, w.Namespace+" "+w.Keys)
	}
	if !strings.Contains(strings.Join(keys, ";"), "nightly-report (") || !strings.Contains(strings.Join(keys, ";"), "payroll-export (") {
		t.Errorf("the waiters' keys are not named: %q", keys)
	}

	page := pageOf(t, h, "?refresh=0")
	for _, want := range []string{"nightly-report", "payroll-export", "invoices", fmt.Sprintf("pid %d", pid), "lockhooks_debug_blocker"} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	if strings.Contains(page, "s3cret-browser-argument") {
		t.Error("an argument is shown")
	}
	for _, width := range []int{1000, 1600} {
		if c := checkPage(t, bin, h, width); !c.WaitsFirst {
			t.Errorf("at %dpx the held locks come before the waits", width)
		}
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	screenshot(t, bin, srv.URL+"?refresh=0", "postgres-names-1000.png", 1000)
	screenshot(t, bin, srv.URL+"?refresh=0", "postgres-names-1600.png", 1600)
	cancel()
	for range 3 {
		<-done
	}
}
