//go:build amd64 || arm64

package callsite

import "unsafe"

// CurrentGoroutine returns the address of the running goroutine's runtime
// descriptor, read from the thread's g register (amd64: thread-local
// storage; arm64: R28), as an opaque identity: it is never dereferenced,
// and stays the same for the goroutine's whole life (the runtime reuses a
// descriptor only after its goroutine exited). It costs a nanosecond.
// lockhooks' model of holders uses it to tell whether a waiter is the
// goroutine that took the lock it would wait for (a self-wait).
func CurrentGoroutine() uintptr

// callerFP returns the frame pointer of its caller's frame.
func callerFP() unsafe.Pointer

// FastCapture says that Stack.CaptureFast walks frame pointers: a stack
// capture costs a few nanoseconds per frame instead of runtime.Callers'
// tens.
const FastCapture = true

// stackBounds returns the bounds [lo, hi) of the running goroutine's
// stack, read from its runtime descriptor (g.stack, the descriptor's first
// two words in every Go release since 1.4). They stay valid while the
// caller runs without growing its stack: a goroutine's stack moves only in
// its own function prologues (and shrinks only at its synchronous safe
// points), never in the middle of a NOSPLIT-free loop without calls.
func stackBounds() (lo, hi uintptr)

// CaptureFast records the call stack by walking the frame pointers of the
// current goroutine's stack, as the runtime's execution tracer does on
// amd64 and arm64 (the return address sits one word above each frame
// pointer). It reads only the goroutine's own stack, in its own frames,
// allocates nothing, and stops at the first frame pointer that is not a
// step up inside the goroutine's stack (a frame without a frame pointer,
// or C frames below a cgo callback, leave anything in the register: the
// walk never follows it out of the stack); the return addresses it records
// are what runtime.Callers records, so String symbolises them the same way
// (inlined frames included).
//
//go:noinline
func (s *Stack) CaptureFast() {
	fp := callerFP() // CaptureFast's own frame
	_, hi := stackBounds()
	s.n = walkFrames(&s.pcs, fp, hi)
}

// walkFrames records in pcs the return addresses of the frame-pointer
// chain from fp, inside a stack that ends at hi: it stops at a zero return
// address, or at a next frame pointer that is not above the current one
// and below hi (with room for its return address).
func walkFrames(pcs *[24]uintptr, fp unsafe.Pointer, hi uintptr) int {
	const word = unsafe.Sizeof(uintptr(0))
	n := 0
	for n < len(pcs) && fp != nil && uintptr(fp)+2*word <= hi {
		pc := *(*uintptr)(unsafe.Add(fp, word))
		if pc == 0 {
			break
		}
		pcs[n] = pc
		n++
		next := *(*unsafe.Pointer)(fp)
		if uintptr(next) <= uintptr(fp) {
			break // nil, or not a step up: the chain left the stack's frames
		}
		fp = next
	}
	return n
}
