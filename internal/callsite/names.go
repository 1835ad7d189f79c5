package callsite

import (
	"runtime"
	"strconv"
	"sync"
)

// maxNames bounds a Names cache: past it, the cache starts again empty.
const maxNames = 4096

// Names names call sites as Stack.String does, symbolising each return
// address once: a transaction's identity names where it began at BEGIN,
// and one code path's transactions begin at the same few addresses, so
// naming the site costs map lookups under a read lock, no allocation. So
// do the sites of advisory-lock statements. lockhooks keeps one per
// database; it is bounded by maxNames. The zero value is ready to use; a
// Names must not be copied once used.
type Names struct {
	mu    sync.RWMutex
	names map[uintptr]string // file:line of the return address's first user frame, "" when it has none
}

// Of returns file:line of s's first user frame, "unknown" when it has
// none.
func (n *Names) Of(s *Stack) string {
	for _, pc := range s.pcs[:s.n] {
		n.mu.RLock()
		name, ok := n.names[pc]
		n.mu.RUnlock()
		if !ok {
			name = userSiteOfPC(pc)
			n.mu.Lock()
			if n.names == nil || len(n.names) >= maxNames {
				n.names = make(map[uintptr]string)
			}
			n.names[pc] = name
			n.mu.Unlock()
		}
		if name != "" {
			return name
		}
	}
	return "unknown"
}

// userSiteOfPC is file:line of the first user frame of return address pc
// (the innermost of the frames inlined there), or "".
func userSiteOfPC(pc uintptr) string {
	frames := runtime.CallersFrames([]uintptr{pc})
	for {
		f, more := frames.Next()
		if isUserFrame(f) {
			return ShortFile(f.File) + ":" + strconv.Itoa(f.Line)
		}
		if !more {
			return ""
		}
	}
}
