//go:build amd64 || arm64

package lockhooks

// currentG returns the address of the running goroutine's runtime
// descriptor, read from the thread's g register (amd64: thread-local
// storage; arm64: R28), as an opaque identity: it is never dereferenced,
// and stays the same for the goroutine's whole life (the runtime reuses a
// descriptor only after its goroutine exited). It costs a nanosecond. The
// model of holders uses it to tell whether a waiter is the goroutine that
// took the lock it would wait for (a self-wait); see selfwait.go.
func currentG() uintptr
