package pgblocking

import (
	"context"
	"database/sql/driver"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"github.com/lockhooks/lockhooks/internal/rawconn"
)

// Probe watches one wait of backend pid that may be for a lock backend
// holder holds (a self-wait lockhooks can prove only by asking): after a
// delay it asks the server, on the side connection, whether pid still
// waits for a lock and holder blocks it, and in the same statement
// cancels pid's statement if so (pg_cancel_backend), so nothing changes
// between the check and the act.
type Probe struct {
	stop chan struct{}
	done chan struct{}
	hit  atomic.Bool // the probe cancelled the statement
}

// Probe starts the probe of backend pid's wait for holder, after delay,
// unless Stop comes first. The cancel ends a backend's statement, so the
// caller starts it only where both backends are provably its connections'
// own, and safe is asked again just before the server is (false: a
// pooler was seen meanwhile, and nothing is sent). The read is bounded by
// the configured timeout.
func (r *Reader[C]) Probe(delay time.Duration, pid, holder int32, safe func() bool) *Probe {
	p := &Probe{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
		if !safe() {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), r.cfg.Timeout)
		defer cancel()
		r.cfg.Side.Use(ctx, func(side driver.Conn) error {
			rows, err := rawconn.Query(ctx, side, fmt.Sprintf(`SELECT pg_cancel_backend(a.pid) FROM pg_stat_activity a
WHERE a.pid = %d AND a.wait_event_type = 'Lock' AND %d = ANY (pg_blocking_pids(a.pid))`, pid, holder), nil)
			if err != nil {
				return err
			}
			defer rows.Close()
			dest := make([]driver.Value, 1)
			if err := rows.Next(dest); err != nil {
				if err == io.EOF {
					return nil
				}
				return err
			}
			if ok, _ := dest[0].(bool); ok {
				p.hit.Store(true)
			}
			return nil
		})
	}()
	return p
}

// Stop ends the probe, waiting for a cancel in flight (it must not meet a
// later statement unexplained), and reports whether it cancelled the
// statement.
func (p *Probe) Stop() (cancelled bool) {
	close(p.stop)
	<-p.done
	return p.hit.Load()
}
