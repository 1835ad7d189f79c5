package main

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks"
	"github.com/lockhooks/lockhooks/internal/pgtest"
	"github.com/lockhooks/lockhooks/internal/testcaps"
)

const (
	dashboardFile = "../../dashboards/lockhooks.json"
	alertsFile    = "../../dashboards/lockhooks-alerts.yml"
)

// The dashboard and the alert rules in dashboards/ against the demo's
// /metrics and a real Prometheus: a workload on Postgres and SQLite
// provokes every signal (deadlock, serialization failure, lock timeout,
// canceled wait, lost lock, parked connection, rerouted and refused
// unlocks, SQLite writer waits); then every metric and label name the
// dashboard and the rules use must be served, every lockhooks metric
// served must be on the dashboard, Prometheus (scraping every second)
// must load the rules, and every panel's and rule's expression must
// evaluate, each panel's with data.
func TestDashboards(t *testing.T) {
	prom, promtool := findPrometheus(t)
	dash := readDashboard(t)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tel, err := newTelemetry(ctx, config{})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.shutdown(context.Background())
	pg := &demo{cfg: config{postgres: pgtest.DSN(t)}, out: io.Discard, tel: tel}
	page, stop, err := pg.serve("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	metricsURL := strings.TrimSuffix(page, debugPath) + metricsPath

	var p *promServer
	if prom != "" {
		if out, err := exec.Command(promtool, "check", "rules", alertsFile).CombinedOutput(); err != nil {
			t.Fatalf("promtool check rules %s: %v\n%s", alertsFile, err, out)
		}
		p = startPrometheus(t, prom, metricsURL)
		p.waitScrapedAfter(t, time.Now()) // the exporter is up before the workload
	}

	start := time.Now()
	sqlite := &demo{cfg: config{}, out: io.Discard, tel: tel, live: pg.live, sqlitePath: filepath.Join(t.TempDir(), "demo.db")}
	round, cleanup := dashboardWorkload(t, ctx, pg, sqlite)
	defer cleanup()
	round(0)
	if p != nil {
		// A second round after a scrape: every series then exists before
		// it grows, so rates and quantiles have something to show.
		p.waitScrapedAfter(t, time.Now())
		round(1)
	}
	t.Logf("workload: %v", time.Since(start).Round(time.Millisecond))

	served := readMetrics(t, metricsURL)
	t.Run("names", func(t *testing.T) { checkNames(t, dash, served) })

	if p == nil {
		return
	}
	t.Run("prometheus", func(t *testing.T) {
		p.waitScrapedAfter(t, time.Now()) // two scrapes after the workload
		p.checkRules(t)
		for _, e := range dash.exprs {
			p.checkExpr(t, e.where, e.expr, true)
		}
		for _, r := range p.rules(t) {
			p.checkExpr(t, "alert "+r.Name, r.Query, false)
		}
		for _, v := range dash.labelValues {
			p.checkLabelValues(t, v)
		}
	})
}

// findPrometheus returns the paths of prometheus and promtool, or "" when
// they are not installed (the test then checks only the names), failing
// under LOCKHOOKS_REQUIRE_PROMETHEUS=1.
func findPrometheus(t *testing.T) (string, string) {
	prom, err1 := exec.LookPath("prometheus")
	promtool, err2 := exec.LookPath("promtool")
	if err := errors.Join(err1, err2); err != nil {
		// Fails under LOCKHOOKS_REQUIRE_PROMETHEUS=1; else noted for the
		// report the test command prints (testcaps.Report).
		testcaps.Missing(t, testcaps.Prometheus, strings.ReplaceAll(err.Error(), "\n", "; "))
		return "", ""
	}
	return prom, promtool
}

// dashboard is what the test reads of dashboards/lockhooks.json.
type dashboard struct {
	exprs       []dashExpr
	labelValues []string // label_values(...) of the variables
}

type dashExpr struct{ where, expr string }

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	type target struct {
		Expr  string `json:"expr"`
		RefID string `json:"refId"`
	}
	type panel struct {
		Title       string   `json:"title"`
		Type        string   `json:"type"`
		Description string   `json:"description"`
		Targets     []target `json:"targets"`
		Panels      []panel  `json:"panels"`
	}
	var raw struct {
		SchemaVersion int     `json:"schemaVersion"`
		Panels        []panel `json:"panels"`
		Templating    struct {
			List []struct {
				Name  string          `json:"name"`
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	if raw.SchemaVersion < 36 {
		t.Errorf("schemaVersion %d: not a current Grafana schema", raw.SchemaVersion)
	}
	var d dashboard
	vars := map[string]string{}
	for _, v := range raw.Templating.List {
		vars[v.Name] = v.Type
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			t.Fatalf("variable %s: %v", v.Name, err)
		}
		d.labelValues = append(d.labelValues, q.Query)
	}
	if vars["datasource"] != "datasource" || vars["job"] != "query" || vars["pool"] != "query" {
		t.Errorf("variables %v: want a datasource variable, a job variable and a pool variable", vars)
	}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			if strings.TrimSpace(p.Description) == "" || strings.Contains(p.Description, "\n") {
				t.Errorf("panel %q: wants a one-line description of what to do when it turns red", p.Title)
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, tg := range p.Targets {
				if !strings.Contains(tg.Expr, `job=~"$job"`) || !strings.Contains(tg.Expr, `db_client_connection_pool_name=~"$pool"`) {
					t.Errorf("panel %q query %s: not filtered by the job and pool variables", p.Title, tg.RefID)
				}
				d.exprs = append(d.exprs, dashExpr{fmt.Sprintf("panel %q query %s", p.Title, tg.RefID), tg.Expr})
			}
		}
	}
	walk(raw.Panels)
	if len(d.exprs) == 0 {
		t.Fatal("no queries in the dashboard")
	}
	return d
}

// served is what the exporter serves: metric families with their types,
// series names and label names.
type served struct {
	families map[string]string   // lockhooks family → type
	series   map[string]bool     // every series name (…_bucket, …_total)
	labels   map[string][]string // series name → label names
	values   map[string]map[string]bool
}

var seriesRE = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? `)
var labelRE = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)

func readMetrics(t *testing.T, u string) served {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	s := served{families: map[string]string{}, series: map[string]bool{}, labels: map[string][]string{}, values: map[string]map[string]bool{}}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if f, ok := strings.CutPrefix(line, "# TYPE "); ok {
			name, typ, _ := strings.Cut(f, " ")
			s.families[name] = typ
			continue
		}
		m := seriesRE.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		s.series[m[1]] = true
		for _, l := range labelRE.FindAllStringSubmatch(m[2], -1) {
			if !slices.Contains(s.labels[m[1]], l[1]) {
				s.labels[m[1]] = append(s.labels[m[1]], l[1])
			}
			if s.values[l[1]] == nil {
				s.values[l[1]] = map[string]bool{}
			}
			s.values[l[1]][l[2]] = true
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return s
}

var (
	metricNameRE = regexp.MustCompile(`\blockhooks_[a-z_]+\b`)
	byRE         = regexp.MustCompile(`\bby \(([^)]*)\)`)
	braceRE      = regexp.MustCompile(`\{[^}]*\}`)
	matcherRE    = regexp.MustCompile(`([a-z_]+)\s*(?:=~|!=|!~|=)\s*"`)
)

// checkNames: the metric and label names the dashboard and the rules use
// are exactly those the exporter serves.
func checkNames(t *testing.T, d dashboard, s served) {
	rules, err := os.ReadFile(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	var exprs []string
	for _, e := range d.exprs {
		exprs = append(exprs, e.expr)
	}
	exprs = append(exprs, d.labelValues...)
	for _, line := range strings.Split(string(rules), "\n") {
		if e, ok := strings.CutPrefix(strings.TrimSpace(line), "expr:"); ok {
			exprs = append(exprs, e)
		}
	}
	used := map[string]bool{}
	usedLabels := map[string]bool{}
	for _, e := range exprs {
		// Metric names: what is left without the label lists of by (…)
		// and the matchers in {…}.
		names := braceRE.ReplaceAllString(byRE.ReplaceAllString(e, ""), "")
		for _, n := range metricNameRE.FindAllString(names, -1) {
			used[n] = true
			if !s.series[n] {
				t.Errorf("%s uses %s, which %s does not serve (served: %s)", dashboardFile, n, metricsPath, strings.Join(sortedKeys(s.series), " "))
			}
		}
		for _, m := range byRE.FindAllStringSubmatch(e, -1) {
			for l := range strings.SplitSeq(m[1], ",") {
				usedLabels[strings.TrimSpace(l)] = true
			}
		}
		for _, m := range matcherRE.FindAllStringSubmatch(e, -1) {
			usedLabels[m[1]] = true
		}
	}
	// Labels: job and instance are Prometheus's, le the histograms'; the
	// others must be served, with the values the dashboard expects.
	for l := range usedLabels {
		switch l {
		case "job", "instance", "le":
			continue
		}
		if s.values[l] == nil {
			t.Errorf("the dashboard uses label %s, which %s does not serve", l, metricsPath)
		}
	}
	if !s.values["lockhooks_lock_kind"]["sqlite_writer"] {
		t.Errorf("no lockhooks_lock_kind=\"sqlite_writer\" served: %v", s.values["lockhooks_lock_kind"])
	}
	// Every lockhooks family served is on the dashboard: a new metric
	// gets a panel.
	for f := range s.families {
		if !strings.HasPrefix(f, "lockhooks_") {
			continue
		}
		found := false
		for n := range used {
			if n == f || strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_count"), "_sum") == f {
				found = true
			}
		}
		if !found {
			t.Errorf("%s serves %s (%s), which no panel of %s shows", metricsPath, f, s.families[f], dashboardFile)
		}
	}
	// The workload produced what the panels show.
	for _, o := range []string{"acquired", "not_acquired", "timeout", "deadlock", "canceled"} {
		if !s.values["lockhooks_lock_outcome"][o] {
			t.Errorf("no wait with outcome %s served: %v", o, s.values["lockhooks_lock_outcome"])
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// dashboardWorkload prepares a workload that provokes every signal the
// dashboard shows; it returns a function running one round of it, and one
// releasing what the rounds leave held (parked connections).
func dashboardWorkload(t *testing.T, ctx context.Context, pg, sqlite *demo) (round func(int), cleanup func()) {
	t.Helper()
	db, err := pg.open(true)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := sql.Open("pgx", pg.cfg.postgres)
	if err != nil {
		t.Fatal(err)
	}
	mustExec := func(db interface {
		ExecContext(context.Context, string, ...any) (sql.Result, error)
	}, q string, args ...any) {
		t.Helper()
		if _, err := db.ExecContext(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	mustExec(raw, "CREATE TABLE dash (id int PRIMARY KEY, v int NOT NULL)")
	mustExec(raw, "INSERT INTO dash VALUES (1, 0), (2, 0)")
	sdb, err := sqlite.open(true)
	if err != nil {
		t.Fatal(err)
	}
	mustExec(sdb, "CREATE TABLE dash (id INTEGER PRIMARY KEY, v INTEGER NOT NULL)")
	begin := func() *sql.Tx {
		t.Helper()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		return tx
	}
	forUpdate := func(ctx context.Context, tx *sql.Tx, id int) error {
		var v int
		return tx.QueryRowContext(ctx, "SELECT v FROM dash WHERE id = $1 FOR UPDATE", id).Scan(&v)
	}

	round = func(n int) {
		// Advisory: acquired, held, released; not_acquired by a try-lock.
		l, err := lockhooks.AcquireAdvisoryLock(ctx, db, lockhooks.LockID("dash/a"))
		if err != nil {
			t.Fatal(err)
		}
		var got bool
		if err := raw.QueryRowContext(ctx, "SELECT pg_try_advisory_lock($1)", l.Key()).Scan(&got); err != nil || got {
			t.Fatalf("raw try-lock: %v, %v", got, err)
		}
		var tried bool
		if err := db.QueryRowContext(ctx, "SELECT pg_try_advisory_lock($1)", l.Key()).Scan(&tried); err != nil || tried {
			t.Fatalf("try-lock of a held key: %v, %v", tried, err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		// A lockset lock (kind lockset) and its hold.
		tx := begin()
		if err := lockhooks.Lock(ctx, tx, "dash", 1, 2); err != nil {
			t.Fatal(err)
		}
		tx.Commit()

		// Row locks: a deadlock (40P01).
		tx1, tx2 := begin(), begin()
		if err := forUpdate(ctx, tx1, 1); err != nil {
			t.Fatal(err)
		}
		if err := forUpdate(ctx, tx2, 2); err != nil {
			t.Fatal(err)
		}
		errs := make(chan error, 2)
		go func() { errs <- forUpdate(ctx, tx1, 2) }()
		waitBlocked(t, ctx, raw, 1)
		go func() { errs <- forUpdate(ctx, tx2, 1) }()
		e1, e2 := <-errs, <-errs
		if !isState(e1, "40P01") && !isState(e2, "40P01") {
			t.Fatalf("no deadlock: %v, %v", e1, e2)
		}
		tx1.Rollback()
		tx2.Rollback()

		// A lock timeout (55P03) and a canceled wait, behind a held row.
		holder := begin()
		if err := forUpdate(ctx, holder, 1); err != nil {
			t.Fatal(err)
		}
		tx3 := begin()
		mustExec(tx3, "SET LOCAL lock_timeout = '100ms'")
		// A context of its own: with the holder's, on the holder's goroutine,
		// the wait's error would also say it is likely a self-wait.
		if err := forUpdate(context.WithoutCancel(ctx), tx3, 1); !isState(err, "55P03") {
			t.Fatalf("lock_timeout: %v", err)
		}
		tx3.Rollback()
		tx4 := begin()
		cctx, ccancel := context.WithCancel(ctx)
		time.AfterFunc(150*time.Millisecond, ccancel)
		if err := forUpdate(cctx, tx4, 1); err == nil {
			t.Fatal("a canceled wait for a held row succeeded")
		}
		tx4.Rollback()
		holder.Rollback()

		// A serialization failure (40001).
		rr, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
		if err != nil {
			t.Fatal(err)
		}
		var v int
		if err := rr.QueryRowContext(ctx, "SELECT v FROM dash WHERE id = 2").Scan(&v); err != nil {
			t.Fatal(err)
		}
		mustExec(db, "UPDATE dash SET v = v + 1 WHERE id = 2")
		if _, err := rr.ExecContext(ctx, "UPDATE dash SET v = v + 1 WHERE id = 2"); !isState(err, "40001") {
			t.Fatalf("serialization failure: %v", err)
		}
		rr.Rollback()

		// Session advisory locks through the pool: one rerouted unlock, one
		// refused (nobody holds the key), one left parked.
		mustExec(db, "SELECT pg_advisory_lock($1)", 7001)
		var ok bool
		if err := db.QueryRowContext(ctx, "SELECT pg_advisory_unlock($1)", 7001).Scan(&ok); err != nil || !ok {
			t.Fatalf("rerouted unlock: %v, %v", ok, err)
		}
		if err := db.QueryRowContext(ctx, "SELECT pg_advisory_unlock($1)", 7002).Scan(&ok); !errors.Is(err, lockhooks.ErrNotLockOwner) {
			t.Fatalf("unlock of a key nobody holds: %v, %v", ok, err)
		}
		mustExec(db, "SELECT pg_advisory_lock($1)", 7003+10*n)

		// A lost lock: the holder's backend is terminated.
		lost, err := lockhooks.AcquireAdvisoryLock(ctx, db, 7004)
		if err != nil {
			t.Fatal(err)
		}
		var pid int32
		if err := lost.Conn().QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			t.Fatal(err)
		}
		mustExec(raw, "SELECT pg_terminate_backend($1)", pid)
		select {
		case <-lost.Lost():
		case <-ctx.Done():
			t.Fatal("the lock of a terminated backend was not reported lost")
		}
		lost.Release(ctx)

		// SQLite: write transactions queue for the writer lock.
		var wg sync.WaitGroup
		for i := range 4 {
			wg.Go(func() {
				for j := range 5 {
					tx, err := sdb.BeginTx(ctx, nil)
					if err != nil {
						t.Error(err)
						return
					}
					if _, err := tx.ExecContext(ctx, "INSERT INTO dash VALUES (?, 0)", n*100+i*10+j); err != nil {
						t.Error(err)
					}
					time.Sleep(5 * time.Millisecond) // hold the writer lock a moment
					if err := tx.Commit(); err != nil {
						t.Error(err)
					}
				}
			})
		}
		wg.Wait()

	}
	return round, func() {
		sqlite.close(sdb)
		pg.close(db) // releases the parked connections
		raw.Close()
	}
}

// waitBlocked waits until n backends wait for a lock.
func waitBlocked(t *testing.T, ctx context.Context, raw *sql.DB, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var got int
		if err := raw.QueryRowContext(ctx, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'").Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d backends waiting for a lock, want %d", got, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func isState(err error, code string) bool {
	var e interface{ SQLState() string }
	return errors.As(err, &e) && e.SQLState() == code
}
