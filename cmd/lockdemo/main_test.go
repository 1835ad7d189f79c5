package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/lockhooks/lockhooks/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// The demo keeps every promise, on SQLite and on Postgres.
func TestDemo(t *testing.T) {
	for _, c := range []struct {
		name string
		args func(t *testing.T) []string
	}{
		{"sqlite", func(*testing.T) []string { return nil }},
		{"postgres", func(t *testing.T) []string { return []string{"-postgres", pgtest.DSN(t)} }},
	} {
		t.Run(c.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			args := append([]string{"-transfers", "25"}, c.args(t)...)
			if code := run(args, &out, &errOut); code != 0 {
				t.Fatalf("exit %d\n%s\n%s", code, out.String(), errOut.String())
			}
			t.Log(out.String())
			if !strings.Contains(out.String(), "Every lockhooks column shows the promised result") {
				t.Errorf("output:\n%s", out.String())
			}
			if c.name == "postgres" && strings.Contains(out.String(), "skipped") {
				t.Errorf("a scenario was skipped on Postgres:\n%s", out.String())
			}
		})
	}
}

func TestDemoHelp(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"-h"}, &out, &errOut); code != 0 || !strings.Contains(errOut.String(), "-postgres") {
		t.Errorf("exit %d, help:\n%s", code, errOut.String())
	}
}
