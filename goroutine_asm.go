//go:build amd64 || arm64

package lockhooks

import "unsafe"

// currentG returns the address of the running goroutine's runtime
// descriptor, read from the thread's g register (amd64: thread-local
// storage; arm64: R28), as an opaque identity: it is never dereferenced,
// and stays the same for the goroutine's whole life (the runtime reuses a
// descriptor only after its goroutine exited). It costs a nanosecond. The
// model of holders uses it to tell whether a waiter is the goroutine that
// took the lock it would wait for (a self-wait); see selfwait.go.
func currentG() uintptr

// callerFP returns the frame pointer of its caller's frame.
func callerFP() unsafe.Pointer

// fastCallers says that captureFast walks frame pointers: a stack capture
// costs a few nanoseconds per frame instead of runtime.Callers' tens.
const fastCallers = true

// maxFrameGap bounds the distance between two frame pointers the walk
// follows: frames are smaller, and a larger or downward step means the
// chain left the goroutine's stack (a frame without a frame pointer, or C
// frames below a cgo callback), where the walk stops.
const maxFrameGap = 1 << 20

// captureFast records the call stack by walking the frame pointers of the
// current goroutine's stack, as the runtime's execution tracer does on
// amd64 and arm64 (the return address sits one word above each frame
// pointer). It reads only the goroutine's own stack, in its own frames,
// stops at the first step that is not a short step up, and allocates
// nothing; the return addresses it records are what runtime.Callers
// records, so String symbolises them the same way (inlined frames
// included).
//
//go:noinline
func (c *callers) captureFast() {
	fp := callerFP() // captureFast's own frame
	n := 0
	for fp != nil && n < len(c.pcs) {
		pc := *(*uintptr)(unsafe.Add(fp, unsafe.Sizeof(uintptr(0))))
		if pc == 0 {
			break
		}
		c.pcs[n] = pc
		n++
		next := *(*unsafe.Pointer)(fp)
		if next == nil || uintptr(next) <= uintptr(fp) || uintptr(next)-uintptr(fp) > maxFrameGap {
			break
		}
		fp = next
	}
	c.n = n
}
