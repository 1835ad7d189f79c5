// Package tiedproc starts child processes that the kernel kills when this
// process dies, and only then.
//
// Linux's parent-death signal (prctl PR_SET_PDEATHSIG, which
// [syscall.SysProcAttr].Pdeathsig sets) is sent when the thread that forked
// the child exits, not the process. The Go runtime ends a thread when a
// goroutine locked to it returns without unlocking, which any code in the
// binary may do; a child started from such a thread is then SIGKILLed in
// the middle of the run (a shared PgBouncer vanished this way in CI, and
// every later pooler test failed to connect). [Start] forks from a
// goroutine locked to its thread until the child has exited, so that thread
// outlives the child.
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
