//go:build !amd64 && !arm64

package lockhooks

// currentG returns 0: on this architecture lockhooks cannot tell
// goroutines apart cheaply, so it recognises no self-wait (see
// selfwait.go) and such waits wait as before.
func currentG() uintptr { return 0 }

// fastCallers says that captureFast is runtime.Callers here: lockhooks
// records where SQLite write transactions begin only after writers waited
// for each other (see writerLock).
const fastCallers = false

// captureFast records the call stack with runtime.Callers.
//
//go:noinline
func (c *callers) captureFast() { c.capture() }
