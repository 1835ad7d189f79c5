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
//
// It owns the processes it started. It imports nothing of lockhooks'. Only
// tests (and internal/pgtest) import it.
package tiedproc
