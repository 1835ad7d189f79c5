package callsite

import (
	"runtime"
	"strings"
)

// modulePath is lockhooks' module.
const modulePath = "github.com/lockhooks/lockhooks"

// isOwnFrame reports whether f is lockhooks' own code: a function of any
// package of its module, except in a _test.go file (lockhooks' tests are
// its users, and the sites they expect are theirs).
func isOwnFrame(f runtime.Frame) bool {
	return isOwnFunction(f.Function) && !strings.HasSuffix(f.File, "_test.go")
}

// isOwnFunction reports whether fn, a function's name as the runtime
// writes it (import path, a dot, the name), belongs to a package of
// lockhooks' module: the root package, or one under it (internal/...,
// modernc) that is not in a module nested in the tree (see
// isNestedModule). lockhooks_test, the root's external tests, and
// github.com/lockhooks/lockhooksx are other packages.
func isOwnFunction(fn string) bool {
	rest, ok := strings.CutPrefix(fn, modulePath)
	if !ok {
		return false
	}
	if strings.HasPrefix(rest, ".") {
		return true // the root package
	}
	rest, ok = strings.CutPrefix(rest, "/")
	return ok && !isNestedModule(rest)
}

// isNestedModule reports whether the function rest names (its import path
// relative to modulePath, a dot, the name) belongs to a module nested in
// lockhooks' tree, an application of lockhooks: the demo (cmd/lockdemo)
// and the integration tests; or third_party, the source releases the tests
// build, which holds no Go code. TestNestedModulesAreTheTreesModules keeps
// this list in step with the go.mod files of the tree.
func isNestedModule(rest string) bool {
	return inPackageTree(rest, "cmd/lockdemo") || inPackageTree(rest, "integration") || inPackageTree(rest, "third_party")
}

// inPackageTree reports whether the function rest names is in the package
// at dir or one below it.
func inPackageTree(rest, dir string) bool {
	after, ok := strings.CutPrefix(rest, dir)
	return ok && after != "" && (after[0] == '.' || after[0] == '/')
}
