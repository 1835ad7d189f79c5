package tiedproc

import (
	"os/exec"
	"runtime"
	"syscall"
)

// A Process is a child started by [Start].
type Process struct {
	cmd    *exec.Cmd
	exited chan struct{}
	err    error // cmd.Wait's, set before exited is closed
}

// Start starts cmd with SIGKILL as its parent-death signal (keeping the
// rest of cmd.SysProcAttr) and waits for it in the background: use
// [Process.Exited] instead of cmd.Wait.
func Start(cmd *exec.Cmd) (*Process, error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	p := &Process{cmd: cmd, exited: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		// The thread that forks is the child's "parent" for the signal:
		// keep it to this goroutine, which lives until the child is gone.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		p.err = cmd.Wait()
		close(p.exited)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return p, nil
}

// Exited is closed once the child has exited and been waited for.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Err is cmd.Wait's error (nil for a clean exit); valid once [Process.Exited]
// is closed.
func (p *Process) Err() error {
	<-p.exited
	return p.err
}
