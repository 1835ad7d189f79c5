//go:build unix

package testcaps

import (
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// goCommandOutput opens the go command's standard output when it is a
// terminal or a pipe (through /proc, on Linux), else the terminal, or
// returns nil. It uses syscall rather than os so that the go command's
// test cache does not record these files as the test's inputs: the test
// result stays cacheable.
func goCommandOutput() *os.File {
	ppid := os.Getppid()
	proc := "/proc/" + strconv.Itoa(ppid)
	buf := make([]byte, 4096)
	if n, err := syscall.Readlink(proc+"/exe", buf); err == nil && filepath.Base(string(buf[:n])) == "go" {
		var st syscall.Stat_t
		path := proc + "/fd/1"
		// Not a regular file: we would write at our own offset, over
		// what the go command writes next.
		if syscall.Stat(path, &st) == nil && (st.Mode&syscall.S_IFMT == syscall.S_IFIFO || st.Mode&syscall.S_IFMT == syscall.S_IFCHR) {
			if fd, err := syscall.Open(path, syscall.O_WRONLY|syscall.O_CLOEXEC, 0); err == nil {
				return os.NewFile(uintptr(fd), path)
			}
		}
	}
	if fd, err := syscall.Open("/dev/tty", syscall.O_WRONLY|syscall.O_CLOEXEC|syscall.O_NOCTTY, 0); err == nil {
		return os.NewFile(uintptr(fd), "/dev/tty")
	}
	return nil
}
