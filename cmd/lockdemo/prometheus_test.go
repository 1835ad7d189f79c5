package main

// A real Prometheus for the dashboard test: started on the demo's metrics,
// queried through its HTTP API; the dashboards' expressions, alert rules
// and label_values variables are evaluated against what it scraped.

import (
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// promServer is a Prometheus server the test started.
type promServer struct {
	api string // http://127.0.0.1:port
}

func startPrometheus(t *testing.T, bin, target string) *promServer {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	rules, err := filepath.Abs(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - %q
scrape_configs:
  - job_name: lockdemo
    metrics_path: %q
    static_configs:
      - targets: [%q]
`, rules, u.Path, u.Host)
	cfgFile := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	var log strings.Builder
	cmd := exec.Command(bin, "--config.file="+cfgFile, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
	})
	p := &promServer{api: "http://" + addr}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(p.api + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		select {
		case err := <-exited:
			t.Fatalf("prometheus exited: %v\n%s", err, log.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus not ready after 30s\n%s", log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// apiResult is the body of a Prometheus HTTP API answer.
type apiResult struct {
	Status    string          `json:"status"`
	ErrorType string          `json:"errorType"`
	Error     string          `json:"error"`
	Data      json.RawMessage `json:"data"`
}

func (p *promServer) get(t *testing.T, path string, q url.Values) apiResult {
	t.Helper()
	resp, err := http.Get(p.api + path + "?" + q.Encode())
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var r apiResult
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return r
}

type sample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

func (p *promServer) query(t *testing.T, expr string) ([]sample, error) {
	t.Helper()
	r := p.get(t, "/api/v1/query", url.Values{"query": {expr}})
	if r.Status != "success" {
		return nil, fmt.Errorf("%s: %s", r.ErrorType, r.Error)
	}
	var d struct {
		ResultType string   `json:"resultType"`
		Result     []sample `json:"result"`
	}
	if err := json.Unmarshal(r.Data, &d); err != nil {
		return nil, err
	}
	if d.ResultType != "vector" {
		return nil, fmt.Errorf("result type %s", d.ResultType)
	}
	return d.Result, nil
}

// waitScrapedAfter waits until Prometheus scraped the demo twice after t0.
func (p *promServer) waitScrapedAfter(t *testing.T, t0 time.Time) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		// timestamp() of the selector itself: the time of the last
		// scrape (of an expression it would be the evaluation time).
		s, err := p.query(t, `timestamp(up{job="lockdemo"}) and up{job="lockdemo"} == 1`)
		if err != nil {
			t.Fatal(err)
		}
		if len(s) == 1 {
			if ts, _ := strconv.ParseFloat(fmt.Sprint(s[0].Value[1]), 64); ts > float64(t0.UnixMilli())/1000+1 {
				return
			}
		}
		if time.Now().After(deadline) {
			r, _ := p.query(t, `up`)
			t.Fatalf("no two scrapes of the demo after %v within 30s: up = %v", t0, r)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// grafanaVars replaces the dashboard's variables by what they stand for
// with every job selected.
var grafanaVars = strings.NewReplacer(`$job`, `.+`, `$pool`, `.+`, `$__rate_interval`, `1m`, `$__interval`, `1m`, `$__range`, `1m`)

// checkExpr evaluates expr; a panel's expression must return data.
func (p *promServer) checkExpr(t *testing.T, where, expr string, wantData bool) {
	t.Helper()
	q := grafanaVars.Replace(expr)
	s, err := p.query(t, q)
	if err != nil {
		t.Errorf("%s: %s: %v", where, expr, err)
		return
	}
	if !wantData {
		t.Logf("%s: %d series", where, len(s))
		return
	}
	finite := 0
	for _, x := range s {
		if v, err := strconv.ParseFloat(fmt.Sprint(x.Value[1]), 64); err == nil && !math.IsNaN(v) && !math.IsInf(v, 0) {
			finite++
		}
	}
	if finite == 0 {
		t.Errorf("%s shows no data for the workload: %s returned %v", where, q, s)
		return
	}
	t.Logf("%s: %d series", where, len(s))
}

type rule struct {
	Name      string `json:"name"`
	Query     string `json:"query"`
	Health    string `json:"health"`
	LastError string `json:"lastError"`
	Type      string `json:"type"`
}

// rules returns the alert rules Prometheus loaded.
func (p *promServer) rules(t *testing.T) []rule {
	t.Helper()
	r := p.get(t, "/api/v1/rules", url.Values{"type": {"alert"}})
	if r.Status != "success" {
		t.Fatalf("/api/v1/rules: %s", r.Error)
	}
	var d struct {
		Groups []struct {
			Rules []rule `json:"rules"`
		} `json:"groups"`
	}
	if err := json.Unmarshal(r.Data, &d); err != nil {
		t.Fatal(err)
	}
	var rs []rule
	for _, g := range d.Groups {
		rs = append(rs, g.Rules...)
	}
	return rs
}

// checkRules: Prometheus loaded the four alerts and evaluates them without
// error.
func (p *promServer) checkRules(t *testing.T) {
	t.Helper()
	want := []string{"LockhooksDeadlocks", "LockhooksLockLost", "LockhooksLockWaitP99High", "LockhooksParkedConnections"}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var names []string
		pending := false
		for _, r := range p.rules(t) {
			names = append(names, r.Name)
			switch r.Health {
			case "ok":
			case "unknown":
				pending = true // not evaluated yet
			default:
				t.Errorf("alert %s: health %s: %s", r.Name, r.Health, r.LastError)
			}
		}
		sort.Strings(names)
		if !slices.Equal(names, want) {
			t.Fatalf("alert rules loaded: %v, want %v", names, want)
		}
		if !pending {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("alert rules not evaluated within 10s")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

var labelValuesRE = regexp.MustCompile(`^label_values\(\s*([^,]+?)\s*,\s*([a-zA-Z_]+)\s*\)$`)

// checkLabelValues runs a variable's label_values(metric, label) as
// Grafana does: the series API must give values.
func (p *promServer) checkLabelValues(t *testing.T, q string) {
	t.Helper()
	m := labelValuesRE.FindStringSubmatch(q)
	if m == nil {
		t.Errorf("variable query %q: not label_values(metric, label)", q)
		return
	}
	r := p.get(t, "/api/v1/label/"+m[2]+"/values", url.Values{"match[]": {m[1]}})
	var vs []string
	ok := r.Status == "success" && json.Unmarshal(r.Data, &vs) == nil
	switch m[2] {
	case "job":
		if !ok || !slices.Contains(vs, "lockdemo") {
			t.Errorf("variable query %q: %s %s %v, want lockdemo among the values", q, r.Status, r.Error, vs)
		}
	default: // the databases' pool names
		if !ok || len(vs) < 2 {
			t.Errorf("variable query %q: %s %s %v, want the demo's Postgres and SQLite databases", q, r.Status, r.Error, vs)
		}
		t.Logf("variable query %q: %v", q, vs)
	}
}
