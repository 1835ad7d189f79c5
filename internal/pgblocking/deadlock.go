package pgblocking

import (
	"context"
	"database/sql/driver"

	"github.com/lockhooks/lockhooks/internal/pgserver"
	"github.com/lockhooks/lockhooks/internal/rawconn"
)

// DeadlockFacts reads, on the side connection, what pg_stat_activity
// still shows of the backends of a deadlock's cycle (edges, from its
// DETAIL) and the relations the DETAIL names by oid; nothing for no edges.
// The read is bounded by the configured timeout; its error is the facts'.
func (r *Reader[C]) DeadlockFacts(edges []pgserver.DeadlockEdge, detail string) pgserver.DeadlockFacts {
	f := pgserver.DeadlockFacts{Backends: map[int32]pgserver.BackendFacts{}, Relations: map[string]string{}}
	if len(edges) == 0 {
		return f
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.Timeout)
	defer cancel()
	query := pgserver.DeadlockFactsQuery(edges, detail)
	f.Err = r.cfg.Side.Use(ctx, func(side driver.Conn) error {
		clear(f.Backends)
		clear(f.Relations)
		rows, err := rawconn.Query(ctx, side, query, nil)
		if err != nil {
			return err
		}
		return pgserver.ReadDeadlockFacts(rows, &f)
	})
	return f
}
