package pgblocking

import (
	"context"
	"database/sql/driver"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/pgserver"
	"github.com/lockhooks/lockhooks/internal/rawconn"
)

// KeyHolders returns the backends other than except that hold the
// advisory keys now, read on the side connection (nil if none or
// unreadable): the holders of a wait that does not wait on the server
// (through a transaction pooler, lockhooks polls with try-locks), or that
// ended before anyone looked. ctx bounds the read.
func (r *Reader[C]) KeyHolders(ctx context.Context, except int32, keys []advisorykey.Key) []holders.Blocker {
	if len(keys) == 0 {
		return nil
	}
	var out []holders.Blocker
	r.cfg.Side.Use(ctx, func(side driver.Conn) error {
		rows, err := rawconn.Query(ctx, side, pgserver.KeyHoldersQuery(keys, except), r.cfg.Own.Of(side).Args)
		if err != nil {
			out = nil
			return err
		}
		out, err = pgserver.ReadKeyHolders(rows, r.cfg.SeenBy)
		return err
	})
	return out
}
