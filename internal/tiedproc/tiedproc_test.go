package tiedproc

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// startOnDyingThread runs start on a goroutine that returns locked to its
// OS thread, so the runtime ends that thread, and waits until the thread
// is gone. (The runtime never ends the main thread: a goroutine that finds
// itself there keeps it and hands the work to another, which then cannot
// run on the main thread.)
func startOnDyingThread(t *testing.T, start func() error) {
	t.Helper()
	tids := make(chan int, 1)
	errs := make(chan error, 1)
	var die func()
	die = func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		if syscall.Gettid() == os.Getpid() {
			done := make(chan struct{})
			go func() { defer close(done); die() }()
			<-done
			runtime.UnlockOSThread()
			return
		}
		tids <- syscall.Gettid()
		errs <- start()
	}
	go die()
	tid := <-tids
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	task := fmt.Sprintf("/proc/self/task/%d", tid)
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(task); os.IsNotExist(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("thread %d did not exit", tid)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// The hazard: a child started with Pdeathsig from a thread that then exits
// is killed, although this process lives on.
func TestPdeathsigFiresWhenTheForkingThreadExits(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	startOnDyingThread(t, cmd.Start)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("child exited with %v, want SIGKILL", err)
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatal("the child outlived the thread that forked it: the kernel no longer ties Pdeathsig to the thread, and tiedproc may be simplified")
	}
}

// A child started by Start outlives the thread of whoever called Start,
// and is killed only when asked.
func TestStartOutlivesTheCallersThread(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	var p *Process
	startOnDyingThread(t, func() (err error) {
		p, err = Start(cmd)
		return err
	})
	t.Cleanup(func() { cmd.Process.Kill(); <-p.Exited() })
	select {
	case <-p.Exited():
		t.Fatalf("the child died with its caller's thread: %v", p.Err())
	default:
	}
	if err := syscall.Kill(cmd.Process.Pid, 0); err != nil {
		t.Fatalf("the child is gone: %v", err)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-p.Exited()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child exited with %v, want SIGKILL", p.Err())
	}
}
