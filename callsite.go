package lockhooks

import (
	"context"
	"runtime"
	"strconv"
	"strings"
)

// callSiteKey carries the user's call site into the hooks.
type callSiteKey struct{}

// callers is a captured call stack, symbolised only when printed, so that
// recording where a lock was taken costs no allocation.
type callers struct {
	pcs [16]uintptr
	n   int
}

// capture records the current call stack.
func (c *callers) capture() { c.n = runtime.Callers(3, c.pcs[:]) }

// String returns file:line of the first frame outside database/sql and
// lockhooks itself.
func (c *callers) String() string {
	f, ok := c.userFrame()
	if !ok {
		return "unknown"
	}
	return shortFile(f.File) + ":" + strconv.Itoa(f.Line)
}

// userFunction returns the function of the first frame outside
// database/sql and lockhooks itself, or "".
func (c *callers) userFunction() string {
	f, _ := c.userFrame()
	return f.Function
}

// userFrame returns the first frame outside database/sql and lockhooks
// itself.
func (c *callers) userFrame() (runtime.Frame, bool) {
	if c.n == 0 {
		return runtime.Frame{}, false
	}
	frames := runtime.CallersFrames(c.pcs[:c.n])
	for {
		f, more := frames.Next()
		internal := strings.HasPrefix(f.Function, "database/sql.") ||
			(strings.HasPrefix(f.Function, "github.com/lockhooks/lockhooks.") && !strings.HasSuffix(f.File, "_test.go"))
		if !internal && f.Function != "" && !strings.HasPrefix(f.Function, "runtime.") {
			return f, true
		}
		if !more {
			return runtime.Frame{}, false
		}
	}
}

// callSite returns file:line of the first caller outside database/sql and
// lockhooks itself.
func callSite() string {
	var c callers
	c.capture()
	return c.String()
}

// shortFile keeps the last two elements of a path.
func shortFile(path string) string {
	if i := strings.LastIndexByte(path, '/'); i > 0 {
		if j := strings.LastIndexByte(path[:i], '/'); j >= 0 {
			return path[j+1:]
		}
	}
	return path
}

// siteOf returns the call site recorded in ctx, or finds it.
func siteOf(ctx context.Context) string {
	if s, ok := ctx.Value(callSiteKey{}).(string); ok {
		return s
	}
	return callSite()
}
