package lockhooks

import (
	"path/filepath"
	"runtime"
)

// testDir is how call sites name this package's directory ("lockhooks/"
// in a checkout of that name): the last element of the directory and a
// slash, as callsite.ShortFile writes it. Tests that expect a site of their own
// file prefix it, so they pass in any checkout.
var testDir = func() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Base(filepath.Dir(file)) + "/"
}()
