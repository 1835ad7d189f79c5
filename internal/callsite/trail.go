package callsite

import (
	"runtime"
	"strconv"
	"strings"
)

// Trail is a call stack captured for the lock-order checker, deeper than
// a Stack: the checker names the application's frames above helpers, and
// database/sql alone adds several frames.
type Trail struct {
	pcs [48]uintptr
	n   int
}

// Capture records the current call stack, from Capture's caller's caller
// up, as Stack.Capture.
func (t *Trail) Capture() { t.n = runtime.Callers(3, t.pcs[:]) }

// trailFrames is how many of the application's frames a Trail names.
const trailFrames = 3

// String returns file:line of the first frames outside database/sql and
// lockhooks: "a.go:10, called from b.go:20, called from c.go:30".
func (t *Trail) String() string {
	if t == nil || t.n == 0 {
		return "unknown"
	}
	var parts []string
	frames := runtime.CallersFrames(t.pcs[:t.n])
	for len(parts) < trailFrames {
		f, more := frames.Next()
		internal := strings.HasPrefix(f.Function, "database/sql.") || isOwnFrame(f)
		if !internal && f.Function != "" && !strings.HasPrefix(f.Function, "runtime.") && !strings.HasPrefix(f.Function, "testing.") {
			parts = append(parts, ShortFile(f.File)+":"+strconv.Itoa(f.Line))
		}
		if !more {
			break
		}
	}
	if len(parts) == 0 {
		return "unknown"
	}
	return strings.Join(parts, ", called from ")
}
