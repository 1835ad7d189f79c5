package lockhooks

import (
	"go/build"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The import rules of ARCHITECTURE.md, enforced: each package of the
// module, by its directory, with the packages of ours its non-test files
// may import. A package missing here, or here but gone, fails the test,
// so a new package is placed in the picture when it is made.
var importRules = map[string]packageRule{
	// The public face and the database/sql adapter.
	".":       {may: []string{"internal/sqlscan", "internal/dberr", "internal/callsite", "internal/identity", "internal/lockorder", "internal/holders", "internal/advisorykey", "internal/sqlitelock", "internal/pgdriver", "internal/pgsession", "internal/retry", "internal/debugpage", "internal/telemetry", "internal/lockset", "internal/pgserver", "internal/waits", "internal/rawconn", "internal/keynames", "internal/sqliteconn", "internal/stmtlocks", "internal/pgblocking", "internal/inprocess", "internal/pgbegin", "internal/holding", "internal/lockdb", "internal/pgstmt", "internal/advisorylock", "internal/driverext"}},
	"modernc": {may: []string{".", "internal/driverext"}},

	// The core: one concept each, none of them on database/sql; the pure
	// ones not on database/sql/driver either (dberr names
	// driver.ErrBadConn, the error a driver reports a dead connection by).
	"internal/sqlscan":     {core: true, pure: true},
	"internal/dberr":       {core: true},
	"internal/callsite":    {core: true, pure: true},
	"internal/identity":    {core: true, pure: true},
	"internal/lockorder":   {core: true, pure: true},
	"internal/holders":     {core: true, pure: true},
	"internal/advisorykey": {core: true, pure: true},
	"internal/pgdriver":    {core: true},
	"internal/lockset":     {core: true, pure: true},
	"internal/rawconn":     {core: true},

	// The core packages over others of the core.
	"internal/sqlitelock":   {core: true, pure: true, may: []string{"internal/callsite"}},
	"internal/stmtlocks":    {core: true, may: []string{"internal/sqlscan", "internal/advisorykey", "internal/lockset", "internal/lockorder", "internal/callsite", "internal/pgdriver"}},
	"internal/sqliteconn":   {core: true, may: []string{"internal/sqlitelock", "internal/rawconn", "internal/dberr", "internal/retry", "internal/pgdriver"}},
	"internal/pgsession":    {core: true, may: []string{"internal/advisorykey", "internal/callsite", "internal/pgdriver", "internal/rawconn", "internal/pgserver", "internal/dberr", "internal/sqlscan", "internal/identity"}},
	"internal/retry":        {core: true, pure: true, may: []string{"internal/dberr"}},
	"internal/debugpage":    {core: true, pure: true, may: []string{"internal/holders", "internal/advisorykey", "internal/callsite"}},
	"internal/telemetry":    {core: true, pure: true, may: []string{"internal/holders", "internal/dberr"}},
	"internal/pgserver":     {core: true, may: []string{"internal/pgdriver", "internal/holders", "internal/advisorykey"}},
	"internal/keynames":     {core: true, pure: true, may: []string{"internal/holders", "internal/lockset"}},
	"internal/waits":        {core: true, pure: true, may: []string{"internal/holders", "internal/telemetry", "internal/callsite"}},
	"internal/inprocess":    {core: true, pure: true, may: []string{"internal/sqlitelock", "internal/callsite", "internal/holders", "internal/lockset"}},
	"internal/holding":      {core: true, pure: true, may: []string{"internal/holders", "internal/advisorykey", "internal/callsite"}},
	"internal/pgbegin":      {core: true, may: []string{"internal/retry", "internal/identity", "internal/dberr", "internal/pgdriver"}},
	"internal/lockdb":       {core: true, pure: true, may: []string{"internal/holders", "internal/holding", "internal/inprocess", "internal/waits", "internal/pgsession", "internal/pgblocking", "internal/debugpage", "internal/keynames", "internal/lockset", "internal/advisorykey", "internal/sqlitelock", "internal/callsite"}},
	"internal/pgstmt":       {core: true, may: []string{"internal/lockdb", "internal/pgsession", "internal/stmtlocks", "internal/sqlscan", "internal/waits", "internal/telemetry", "internal/holders", "internal/holding", "internal/inprocess", "internal/pgblocking", "internal/rawconn", "internal/advisorykey", "internal/dberr"}},
	"internal/advisorylock": {core: true, may: []string{"internal/pgsession", "internal/pgstmt", "internal/keynames", "internal/pgdriver", "internal/dberr"}},
	"internal/pgblocking":   {core: true, may: []string{"internal/pgserver", "internal/rawconn", "internal/identity", "internal/pgdriver", "internal/holders", "internal/advisorykey"}},

	// Driver plumbing shared by the root and its driver subpackages.
	"internal/driverext": {},

	// Test scaffolding and commands: never imported by the library.
	"internal/pgtest":      {tooling: true, may: []string{"internal/testcaps", "internal/tiedproc"}},
	"internal/faultproxy":  {tooling: true},
	"internal/testcaps":    {tooling: true},
	"internal/tiedproc":    {tooling: true},
	"internal/benchreport": {tooling: true},
	"internal/ifacegen":    {tooling: true},
}

// A packageRule says what one package may import.
type packageRule struct {
	may     []string // packages of ours (directories) its non-test files may import
	core    bool     // a core package: does not import database/sql
	pure    bool     // nor database/sql/driver
	tooling bool     // test scaffolding or a command: no library package imports it
}

const modulePath = "github.com/lockhooks/lockhooks"

// TestImportRules checks every package of the module against importRules
// and ARCHITECTURE.md: a package imports only what its rule allows, the
// core does not depend on database/sql, no library package imports test
// scaffolding, every internal package says its job in a doc.go, and
// ARCHITECTURE.md names every package.
func TestImportRules(t *testing.T) {
	dirs := modulePackages(t)
	arch, err := os.ReadFile("ARCHITECTURE.md")
	if err != nil {
		t.Fatalf("reading ARCHITECTURE.md: %v", err)
	}
	for _, dir := range dirs {
		rule, ok := importRules[dir]
		if !ok {
			t.Errorf("package %s has no import rule: place it in ARCHITECTURE.md and in importRules (architecture_test.go)", dir)
			continue
		}
		pkg, err := build.ImportDir(dir, 0)
		if err != nil {
			t.Errorf("reading %s: %v", dir, err)
			continue
		}
		for _, imp := range pkg.Imports {
			if rule.core && imp == "database/sql" || rule.pure && imp == "database/sql/driver" {
				t.Errorf("%s imports %s: the core does not depend on database/sql (the adapter at the root does)", dir, imp)
			}
			ours, isOurs := strings.CutPrefix(imp, modulePath+"/")
			if imp == modulePath {
				ours, isOurs = ".", true
			}
			if !isOurs {
				continue
			}
			if !slices.Contains(rule.may, ours) {
				t.Errorf("%s imports %s, which its rule does not allow (ARCHITECTURE.md)", dir, ours)
			}
			if r, ok := importRules[ours]; ok && r.tooling && !rule.tooling {
				t.Errorf("%s imports test scaffolding %s", dir, ours)
			}
		}
		if strings.HasPrefix(dir, "internal/") {
			if _, err := os.Stat(filepath.Join(dir, "doc.go")); err != nil {
				t.Errorf("%s has no doc.go saying its one job, the state it owns and what it may import", dir)
			}
		}
		if dir != "." && !strings.Contains(string(arch), "`"+dir+"`") {
			t.Errorf("ARCHITECTURE.md does not name package `%s`", dir)
		}
	}
	for dir := range importRules {
		if !slices.Contains(dirs, dir) {
			t.Errorf("importRules names %s, which is not a package of the module any more", dir)
		}
	}
}

// modulePackages returns the directories (relative, "." for the root)
// holding the Go packages of this module: nested modules (cmd/lockdemo,
// integration), testdata and hidden directories are not part of it.
func modulePackages(t *testing.T) []string {
	t.Helper()
	var dirs []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		name := d.Name()
		if path != "." && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata") {
			return filepath.SkipDir
		}
		if path != "." {
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir // a module of its own
			}
		}
		if pkg, err := build.ImportDir(path, 0); err == nil && len(pkg.GoFiles) > 0 {
			dirs = append(dirs, filepath.ToSlash(path))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return dirs
}

// maxFileLines is the size past which a Go file has outgrown one concept.
const maxFileLines = 600

// TestNoFileOutgrowsItsConcept fails for a Go file of the repository (the
// nested modules' included, generated files not) over maxFileLines: split
// it by concept, as ARCHITECTURE.md places them.
func TestNoFileOutgrowsItsConcept(t *testing.T) {
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if generated.Match(b) {
			return nil
		}
		if n := strings.Count(string(b), "\n"); n > maxFileLines {
			t.Errorf("%s has %d lines (at most %d): split it by concept", path, n, maxFileLines)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// generated matches the comment that marks a generated Go file.
var generated = regexp.MustCompile(`(?m)^// Code generated .* DO NOT EDIT\.$`)
