//go:build !amd64 && !arm64

package callsite

// CurrentGoroutine returns 0: on this architecture goroutines cannot be
// told apart cheaply, so lockhooks recognises no self-wait and such waits
// wait as before.
func CurrentGoroutine() uintptr { return 0 }

// FastCapture says that Stack.CaptureFast is runtime.Callers here:
// lockhooks records where SQLite write transactions begin only after
// writers waited for each other.
const FastCapture = false

// CaptureFast records the call stack with runtime.Callers, from its
// caller up (as the frame-pointer walk does where there is one).
//
//go:noinline
func (s *Stack) CaptureFast() { s.Capture() }
