package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncWriter is an output the demo and the test share.
type syncWriter struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// -serve prints the page's URL and serves it while the scenarios and the
// showcase run; the showcase's held lock and waiter appear on it.
func TestDemoServe(t *testing.T) {
	var out, errOut syncWriter
	code := make(chan int, 1)
	go func() {
		code <- run([]string{"-transfers", "5", "-serve", "127.0.0.1:0", "-serve-for", "8s"}, &out, &errOut)
	}()
	urlRE := regexp.MustCompile(`Live lock page: (http://\S+)`)
	var url string
	deadline := time.Now().Add(30 * time.Second)
	for url == "" {
		if m := urlRE.FindStringSubmatch(out.String()); m != nil {
			url = m[1]
		} else if time.Now().After(deadline) {
			t.Fatalf("no URL printed:\n%s\n%s", out.String(), errOut.String())
		} else {
			time.Sleep(10 * time.Millisecond)
		}
	}
	if !strings.HasSuffix(url, "/debug/locks") {
		t.Errorf("URL %s", url)
	}
	// The showcase holds a lock while another connection waits for it.
	deadline = time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(url + "?format=json")
		if err != nil {
			t.Fatal(err)
		}
		var rep struct {
			Databases []struct {
				Held    []json.RawMessage `json:"held"`
				Waiters []json.RawMessage `json:"waiters"`
			} `json:"databases"`
		}
		err = json.NewDecoder(resp.Body).Decode(&rep)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Databases) == 1 && len(rep.Databases[0].Held) > 0 && len(rep.Databases[0].Waiters) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the page never showed a held lock and a waiter: %+v\n%s", rep, out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), "lockhooks: locks") {
		t.Errorf("%s: %s\n%s", url, resp.Status, body)
	}
	// Beside it, lockhooks' metrics in the Prometheus format, with the
	// names the dashboards in dashboards/ use.
	if m := regexp.MustCompile(`Prometheus metrics: (http://\S+)`).FindStringSubmatch(out.String()); m == nil || m[1] != strings.TrimSuffix(url, "/debug/locks")+"/metrics" {
		t.Errorf("metrics URL %v, page %s", m, url)
	}
	resp, err = http.Get(strings.TrimSuffix(url, "/debug/locks") + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !regexp.MustCompile(`(?m)^lockhooks_lock_wait_duration_seconds_bucket\{db_client_connection_pool_name="[^"]+",db_system_name="sqlite",lockhooks_lock_kind="`).Match(body) {
		t.Errorf("/metrics: %s\n%s", resp.Status, body)
	}
	if c := <-code; c != 0 {
		t.Fatalf("exit %d\n%s\n%s", c, out.String(), errOut.String())
	}
}
