package holding

import (
	"context"

	"github.com/lockhooks/lockhooks/internal/callsite"
)

// SelfWait returns the connection among conns, other than self, whose
// open transaction ctx's call chain holds: certain when it is RunInTx's
// with fn running on this goroutine, else one this goroutine began with
// ctx (likely), or none. conns are a database's open connections, the
// keys of a map (advisory locks and rows belong to one database; ranging
// over the map itself allocates nothing); the caller keeps them from
// changing while SelfWait looks, so it is called only on the way to a
// wait that may be one.
func SelfWait[C Conn[K], K Key, V any](ctx context.Context, self C, conns map[C]V) (h C, found, certain bool) {
	g := callsite.CurrentGoroutine()
	if g == 0 {
		return h, false, false
	}
	for c := range conns {
		if c == self {
			continue
		}
		if c.Run().OnThisStack() {
			return c, true, true
		}
		tx := c.Transaction()
		if !found && tx.Goroutine() == g { // cheap: most transactions are other goroutines'
			if _, _, _, txCtx, open := tx.Snapshot(); open && callsite.SameCallChain(ctx, txCtx, g) {
				h, found = c, true
			}
		}
	}
	return h, found, false
}
