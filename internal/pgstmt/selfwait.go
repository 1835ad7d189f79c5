package pgstmt

import (
	"context"
	"fmt"
	"time"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
	"github.com/lockhooks/lockhooks/internal/dberr"
	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/holding"
	"github.com/lockhooks/lockhooks/internal/inprocess"
	"github.com/lockhooks/lockhooks/internal/pgblocking"
	"github.com/lockhooks/lockhooks/internal/sqlscan"
	"github.com/lockhooks/lockhooks/internal/waits"
)

// Self-waits: a request that would wait for a lock held by a transaction
// of its own call chain on another connection of the database
// (lockdb.DB.SelfWait: certain under RunInTx's fn on the waiting
// goroutine, else likely). A certain one fails at once with an error
// wrapping ErrSelfWait (inprocess.SelfWaitError); a likely one waits, and
// its timeout error and slow-wait log line say it is likely one.

// SelfWaitAdvisory fails a blocking request of c for Postgres advisory
// keys that a transaction of the caller's own call chain holds, for
// certain, on another connection of the same database: Lock (names gives
// its keys' lockset ids), or a pg_advisory_lock / pg_advisory_xact_lock
// statement. For a likely self-wait it returns the hint for the wait
// (waits.Lock.NoteSelfHint). waiter describes the request, for the error
// only (formatting it on every request would cost allocations).
func (db *Database[C, K]) SelfWaitAdvisory(ctx context.Context, c C, waiter func() string, keys []K, names map[int64]string) (hint string, err error) {
	if len(keys) == 0 {
		return "", nil
	}
	h, found, certain := db.SelfWait(ctx, c)
	if !found {
		return "", nil
	}
	held, ok := holding.HeldAmong(h, keys)
	if !ok {
		return "", nil
	}
	if !certain {
		return inprocess.HintTx, nil
	}
	what := "advisory key " + held.String()
	if name := names[advisorykey.Key(held).K1]; name != "" {
		what = "lockset id " + name + " (" + what + ")"
	}
	return "", inprocess.SelfWaitError(waiter(), what, holding.Of(h, []K{held}))
}

// watchSelfWait starts, for a Postgres row-lock wait w of c (statement
// st) while a transaction of the same call chain is open on another
// connection of the database, the probe that fails it with ErrSelfWait if
// that transaction is certainly its own, or notes the hint of a likely
// self-wait. NOWAIT and SKIP LOCKED never wait.
//
// The probe cancels a backend, so it runs only where both backends are
// provably the connections' own: each reached the server itself and no
// pooler is declared or seen (endable). Through a pooler the backend a
// connection met at connect may serve another client, whose statement the
// probe would cancel; there the wait is only noted as likely a self-wait.
func (db *Database[C, K]) watchSelfWait(ctx context.Context, c C, w *waits.Lock[C, K], st Statement) {
	if st.Locks&(sqlscan.NoWait|sqlscan.SkipLocked) != 0 {
		return
	}
	h, found, certain := db.SelfWait(ctx, c)
	switch {
	case !found:
	case certain && endable(c) && endable(h):
		db.probeSelfWait(w, c, h)
	default:
		w.NoteSelfHint(inprocess.HintTx)
	}
}

// SelfWaitProbeDelay is how long a Postgres row-lock wait that may be a
// self-wait runs before lockhooks asks the server whose lock it waits for.
const SelfWaitProbeDelay = 50 * time.Millisecond

// selfWaitProbe is a Postgres row-lock wait's probe (pgblocking.Probe):
// lockhooks knows no row a transaction holds, so after SelfWaitProbeDelay
// it asks the server whether the statement waits for the transaction of
// holder, which it then names in the error.
type selfWaitProbe struct {
	*pgblocking.Probe
	holder holders.Holder
}

// probeSelfWait starts the probe of a row-lock wait w of c for the
// transaction of h.
func (db *Database[C, K]) probeSelfWait(w *waits.Lock[C, K], c, h C) {
	pid, hpid := c.Pin().PID.Load(), h.Pin().PID.Load()
	if w == nil || pid == 0 || hpid == 0 {
		return
	}
	safe := func() bool { return endable(c) && endable(h) } // (a pooler seen since watchSelfWait)
	w.SetProbe(&selfWaitProbe{Probe: db.Blocking.Probe(SelfWaitProbeDelay, pid, hpid, safe), holder: holding.Of(h, []K(nil))})
}

// selfWaitResult ends the self-wait probe of the wait w, if any, and
// turns the cancellation it made into an error wrapping ErrSelfWait.
func (db *Database[C, K]) selfWaitResult(w *waits.Lock[C, K], statement string, err error) error {
	p, _ := w.TakeProbe().(*selfWaitProbe)
	if p == nil {
		return err
	}
	if !p.Stop() || dberr.SQLState(err) != "57014" {
		return err
	}
	e := fmt.Errorf("%w; Postgres cancelled the waiting statement: %w",
		inprocess.SelfWaitError(fmt.Sprintf("the statement %.120q", statement), "a row lock", p.holder), err)
	db.Events.Add(EventSelfWait, e.Error())
	return e
}
