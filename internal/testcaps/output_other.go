//go:build !unix

package testcaps

import "os"

// goCommandOutput finds no way around the go command's capture here: the
// report goes to the test's output (shown with -v).
func goCommandOutput() *os.File { return nil }
