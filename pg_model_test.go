package lockhooks

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/lockhooks/lockhooks/internal/faultproxy"
	"github.com/lockhooks/lockhooks/internal/pgtest"
)

// The model-based differential test: seeded random sequences of advisory
// lock operations through lockhooks against a real Postgres. After every
// step, lockhooks' view of each connection (session locks and the current
// transaction's locks) must equal what pg_locks shows for its backend,
// unless lockhooks has already reported that connection's locks lost. At
// the end every session lock is unlocked as many times as lockhooks
// counted, each unlock must answer true, and then nothing may be held.
//
// LOCKHOOKS_MODEL_SEEDS sets how many seeds run (default 6, as CI runs);
// LOCKHOOKS_MODEL_SEED replays one seed; LOCKHOOKS_MODEL_STEPS the steps
// per seed (default 60). A failure prints the seed and the steps so far.
func TestTrackingMatchesPgLocks(t *testing.T) {
	runModel(t, modelDirect, 6, 60)
}

// TestTrackingMatchesPgLocksThroughPgBouncer is the model test through
// PgBouncer in transaction mode (1.18 and 1.25), on a database opened with
// WithTransactionPooler: the statements such a database accepts (session
// locks in statements of their own, transactions, unlocks through the
// pool, terminated holders), each connection's session locks compared with
// pg_locks of its holder's backend. The same variables as
// TestTrackingMatchesPgLocks (default 3 seeds of 40 steps in CI).
func TestTrackingMatchesPgLocksThroughPgBouncer(t *testing.T) {
	for _, v := range pgtest.Versions {
		t.Run(v.String(), func(t *testing.T) { runModelOn(t, modelPooled, v, 3, 40) })
	}
}

// TestTrackingMatchesPgLocksWithFaults is the model test with network
// faults injected between its steps (issue 21): the connections reach the
// server through a proxy that cuts a connection on both sides, or on the
// client's side only (half-open: the server keeps the backend and its
// locks), or the server terminates a backend. A faulted connection's next
// statement must fail (with ErrLockLost where it held session locks), and
// lockhooks' view must still equal pg_locks: a connection it reports lost
// holds nothing on the server, once lockhooks has ended the backends the
// fault left behind. The same variables (default 3 seeds of 40 steps).
func TestTrackingMatchesPgLocksWithFaults(t *testing.T) {
	runModel(t, modelFaults, 3, 40)
}

// runModel runs the model test of kind: seeds × steps by default.
func runModel(t *testing.T, kind modelKind, seeds, steps int) {
	runModelOn(t, kind, "", seeds, steps)
}

// runModelOn is runModel through PgBouncer version v (modelPooled).
func runModelOn(t *testing.T, kind modelKind, v pgtest.Version, seeds, steps int) {
	seeds, steps = envInt("LOCKHOOKS_MODEL_SEEDS", seeds), envInt("LOCKHOOKS_MODEL_STEPS", steps)
	first := uint64(1)
	if s := os.Getenv("LOCKHOOKS_MODEL_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		first, seeds = n, 1
	}
	for seed := first; seed < first+uint64(seeds); seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			m := newModel(t, seed, kind, v)
			for i := range steps {
				m.step(i)
				m.check(fmt.Sprintf("after step %d", i))
			}
			m.drain()
		})
	}
}

// modelKind is how the model's database is reached.
type modelKind int

const (
	modelDirect modelKind = iota // straight to the server
	modelPooled                  // through PgBouncer (transaction mode), WithTransactionPooler
	modelFaults                  // through a fault-injecting proxy, with fault steps
)

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// model is one run: a lockhooks database, two slots that may hold a
// *sql.Conn (and a transaction on it), and a raw session holding the key
// that blocked-lock steps wait for.
type model struct {
	t       *testing.T
	seed    uint64
	kind    modelKind
	rnd     *rand.Rand
	e       *pinEnv
	proxy   *faultproxy.Proxy // modelFaults
	conn    *connector
	slots   [2]*slot
	blocker *sql.Conn
	history []string
}

type slot struct {
	c  *sql.Conn
	tx *sql.Tx
}

// blockedKey is held by the raw blocker for the whole run.
const blockedKey = 9

func newModel(t *testing.T, seed uint64, kind modelKind, v pgtest.Version) *model {
	m := &model{t: t, seed: seed, kind: kind, rnd: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
	switch kind {
	case modelDirect:
		m.e = newPinEnv(t, WithVerifyOnReturn(true))
	case modelPooled:
		m.e = newPooledPinEnv(t, v)
	case modelFaults:
		fe := newFaultEnv(t, nil, WithVerifyOnReturn(true))
		m.e, m.proxy = fe.pinEnv, fe.proxy
	}
	e := m.e
	for _, q := range []string{
		`CREATE FUNCTION lh_advisory_take(k bigint) RETURNS void LANGUAGE sql AS 'SELECT pg_advisory_lock(k)'`,
		`CREATE FUNCTION lh_advisory_give(k bigint) RETURNS boolean LANGUAGE sql AS 'SELECT pg_advisory_unlock(k)'`,
		`CREATE FUNCTION take_quietly(k bigint) RETURNS boolean LANGUAGE sql AS 'SELECT pg_try_advisory_lock(k)'`,
	} {
		mustExec(t, e.raw, q)
	}
	m.conn = e.connector(t)
	if kind != modelPooled { // no lock waits through the pooler (it polls)
		m.blocker = otherConn(t, e.raw)
		mustExec(t, m.blocker, "SELECT pg_advisory_lock($1)", blockedKey)
	}
	t.Cleanup(func() {
		for _, s := range m.slots {
			if s != nil {
				if s.tx != nil {
					s.tx.Rollback()
				}
				s.c.Close()
			}
		}
	})
	return m
}

func (m *model) fail(format string, args ...any) {
	m.t.Helper()
	name := [...]string{modelDirect: "TestTrackingMatchesPgLocks", modelPooled: "TestTrackingMatchesPgLocksThroughPgBouncer", modelFaults: "TestTrackingMatchesPgLocksWithFaults"}[m.kind]
	m.t.Fatalf("seed %d (replay: LOCKHOOKS_MODEL_SEED=%d go test -race -run '%s$' .): %s\nsteps:\n  %s",
		m.seed, m.seed, name, fmt.Sprintf(format, args...), strings.Join(m.history, "\n  "))
}

// newPooledPinEnv is a pinEnv whose lockhooks database goes through a
// PgBouncer of its own (transaction mode, with room for the holders' open
// transactions, each of which keeps a server connection, beside the slots'
// and the monitor's) with WithTransactionPooler; raw goes straight to the
// server. PgBouncer's server connections outlive lockhooks' clients, so the
// end check is that no advisory lock is left in the database. (See
// newOwnPoolerEnv for why a PgBouncer of its own.)
func newPooledPinEnv(t *testing.T, v pgtest.Version) *pinEnv {
	t.Helper()
	pe, _ := newOwnPoolerEnv(t, pgtest.PoolerOptions{Version: v, PoolSize: 20})
	e := &pinEnv{raw: pe.raw, app: pe.app, log: pe.log, metrics: sdkmetric.NewManualReader()}
	var err error
	e.wrapped, err = Open("pgx", withApp(pe.pooled, e.app), WithTransactionPooler(),
		WithLockCheckInterval(20*time.Millisecond),
		WithLogger(slog.New(slog.NewTextHandler(e.log, nil))),
		WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(e.metrics))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		e.wrapped.Close()
		pe.waitNoAdvisoryLocks(t)
	})
	return e
}

// execer is a slot's transaction, its connection, or the pool.
type execer interface {
	ExecContext(context.Context, string, ...any) (sql.Result, error)
	QueryRowContext(context.Context, string, ...any) *sql.Row
}

// target picks where a statement runs: a slot (opened if needed) or the pool.
func (m *model) target(allowPool bool) (execer, *slot, string) {
	if allowPool && m.rnd.IntN(3) == 0 {
		return m.e.wrapped, nil, "db"
	}
	i := m.rnd.IntN(len(m.slots))
	if m.slots[i] == nil {
		c, err := m.e.wrapped.Conn(context.Background())
		if err != nil {
			m.fail("opening a slot: %v", err)
		}
		m.slots[i] = &slot{c: c}
	}
	s := m.slots[i]
	if s.tx != nil {
		return s.tx, s, fmt.Sprintf("slot%d/tx", i)
	}
	return s.c, s, fmt.Sprintf("slot%d", i)
}

// free reports whether a lock of key (k1, k2 for pairs) in mode would be
// granted at once to some backend of this database: no backend holds a
// conflicting mode, or only the one that would ask.
func (m *model) free(k lockKey) bool {
	class, obj, sub := m.classObj(k)
	rows, err := m.e.raw.Query(`SELECT mode FROM pg_locks WHERE locktype = 'advisory'
		AND classid::bigint = $1 AND objid::bigint = $2 AND objsubid = $3`, class, obj, sub)
	if err != nil {
		m.fail("%v", err)
	}
	defer rows.Close()
	for rows.Next() {
		var mode string
		rows.Scan(&mode)
		if !k.Shared || mode == "ExclusiveLock" {
			return false
		}
	}
	return true
}

func (m *model) classObj(k lockKey) (int64, int64, int) {
	if k.Pair {
		return int64(uint32(int32(k.K1))), int64(uint32(int32(k.K2))), 2
	}
	return int64(uint64(k.K1) >> 32), k.K1 & 0xffffffff, 1
}

// randomKey picks a key among a few, so that re-entrancy, shared holders
// and conflicts happen often.
func (m *model) randomKey() lockKey {
	k := lockKey{K1: int64(1 + m.rnd.IntN(3)), Shared: m.rnd.IntN(4) == 0}
	if m.rnd.IntN(5) == 0 {
		k.Pair, k.K2 = true, int64(1+m.rnd.IntN(2))
	}
	return k
}

// call spells a call of fn on k in one of the ways users write it.
func (m *model) call(fn string, k lockKey) (string, []any) {
	if k.Shared {
		fn += "_shared"
	}
	if k.Pair {
		return fmt.Sprintf("%s(%d, %d)", fn, k.K1, k.K2), nil
	}
	switch m.rnd.IntN(4) {
	case 0:
		return fmt.Sprintf("%s($1)", fn), []any{k.K1}
	case 1:
		return fmt.Sprintf("%s(abs($1::bigint))", fn), []any{k.K1} // an expression key
	case 2:
		return fmt.Sprintf(`"%s"(%d)`, fn, k.K1), nil
	}
	return fmt.Sprintf("%s(%d)", fn, k.K1), nil
}

func (m *model) step(i int) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	op := m.rnd.IntN(15)
	switch m.kind {
	case modelPooled:
		// Through the pooler lockhooks refuses what it cannot split from a
		// holder (several calls, DO blocks), cannot see (a function taking
		// a lock on whatever server connection runs it), or runs elsewhere
		// (transaction-level locks, whose backend lockhooks does not know;
		// a lock wait, which polls instead); DISCARD ALL would reset another
		// client's server connection.
		for op == 5 || op == 6 || op == 7 || op == 8 || op == 12 {
			op = m.rnd.IntN(15)
		}
	case modelFaults:
		op = m.rnd.IntN(18)
	}
	var desc string
	var err error
	switch op {
	case 0, 1: // lock
		k := m.randomKey()
		if !m.free(k) {
			k.Shared = false
			c, args := m.call("pg_try_advisory_lock", k)
			x, _, where := m.target(true)
			desc = where + ": SELECT " + c
			_, err = x.ExecContext(ctx, "SELECT "+c, args...)
			break
		}
		c, args := m.call("pg_advisory_lock", k)
		x, _, where := m.target(true)
		desc = where + ": SELECT " + c
		_, err = x.ExecContext(ctx, "SELECT "+c, args...)
	case 2: // try, read as a row
		c, args := m.call("pg_try_advisory_lock", m.randomKey())
		x, _, where := m.target(true)
		desc = where + ": SELECT " + c + " AS got"
		var got bool
		err = x.QueryRowContext(ctx, "SELECT "+c+" AS got", args...).Scan(&got)
	case 3, 4: // unlock
		c, args := m.call("pg_advisory_unlock", m.randomKey())
		x, _, where := m.target(true)
		desc = where + ": SELECT " + c
		var ok bool
		err = x.QueryRowContext(ctx, "SELECT "+c, args...).Scan(&ok)
		if errors.Is(err, ErrNotLockOwner) {
			err = nil
		}
	case 5: // several calls in one statement
		a, b := m.randomKey(), m.randomKey()
		a.Shared, b.Shared = false, false
		fn := "pg_advisory_unlock"
		if m.rnd.IntN(2) == 0 && m.free(a) && m.free(b) {
			fn = "pg_advisory_lock"
		}
		ca, _ := m.call(fn, lockKey{K1: a.K1, K2: a.K2, Pair: a.Pair})
		cb, _ := m.call(fn, lockKey{K1: b.K1, K2: b.K2, Pair: b.Pair})
		ca, cb = literal(ca, a), literal(cb, b)
		x, _, where := m.target(true)
		desc = where + ": SELECT " + ca + ", " + cb
		_, err = x.ExecContext(ctx, "SELECT "+ca+", "+cb)
		if errors.Is(err, ErrNotLockOwner) {
			err = nil
		}
	case 6: // DO block or a function whose name mentions advisory locks
		k := m.randomKey()
		k.Shared, k.Pair = false, false
		x, _, where := m.target(false)
		stmts := []string{
			fmt.Sprintf("DO $$BEGIN PERFORM pg_advisory_unlock(%d); END$$", k.K1),
			fmt.Sprintf("SELECT lh_advisory_give(%d)", k.K1),
		}
		if m.free(k) {
			stmts = append(stmts, fmt.Sprintf("DO $$BEGIN PERFORM pg_advisory_lock(%d); END$$", k.K1), fmt.Sprintf("SELECT lh_advisory_take(%d)", k.K1))
		}
		q := stmts[m.rnd.IntN(len(stmts))]
		desc = where + ": " + q
		_, err = x.ExecContext(ctx, q)
	case 7: // a function that locks where no text shows it, through the pool
		k := m.randomKey()
		desc = fmt.Sprintf("db: SELECT take_quietly(%d)", k.K1)
		var got bool
		err = m.e.wrapped.QueryRowContext(ctx, "SELECT take_quietly($1)", k.K1).Scan(&got)
	case 8: // transaction-level locks inside a transaction
		i := m.rnd.IntN(len(m.slots))
		s := m.openSlot(i)
		if s.tx == nil {
			if s.tx, err = s.c.BeginTx(context.Background(), nil); err != nil {
				break
			}
		}
		k := m.randomKey()
		fn := "pg_try_advisory_xact_lock"
		if m.free(k) {
			fn = "pg_advisory_xact_lock"
		}
		c, args := m.call(fn, k)
		desc = fmt.Sprintf("slot%d/tx: SELECT %s", i, c)
		_, err = s.tx.ExecContext(ctx, "SELECT "+c, args...)
	case 9: // begin, commit or rollback
		i := m.rnd.IntN(len(m.slots))
		s := m.openSlot(i)
		switch {
		case s.tx == nil:
			desc = fmt.Sprintf("slot%d: BeginTx", i)
			s.tx, err = s.c.BeginTx(context.Background(), nil)
		case m.rnd.IntN(2) == 0:
			desc = fmt.Sprintf("slot%d: Commit", i)
			err, s.tx = s.tx.Commit(), nil
		default:
			desc = fmt.Sprintf("slot%d: Rollback", i)
			err, s.tx = s.tx.Rollback(), nil
		}
	case 10: // release everything
		x, s, where := m.target(true)
		q := "SELECT pg_advisory_unlock_all()"
		if s != nil && s.tx == nil && m.rnd.IntN(2) == 0 && m.kind != modelPooled {
			q = "/* reset */ DISCARD ALL"
		}
		desc = where + ": " + q
		_, err = x.ExecContext(ctx, q)
		if strings.Contains(q, "DISCARD") {
			// pgx's statement cache no longer matches the server: return the
			// connection, which lockhooks then closes.
			for i := range m.slots {
				if m.slots[i] == s {
					s.c.Close()
					m.slots[i] = nil
				}
			}
		}
	case 11: // return a slot's connection to the pool
		i := m.rnd.IntN(len(m.slots))
		if s := m.slots[i]; s != nil {
			desc = fmt.Sprintf("slot%d: Close", i)
			if s.tx != nil {
				s.tx.Rollback()
			}
			err = s.c.Close()
			m.slots[i] = nil
		}
	case 12: // a context cancelled while a lock waits
		i := m.rnd.IntN(len(m.slots))
		s := m.openSlot(i)
		if s.tx != nil {
			break
		}
		desc = fmt.Sprintf("slot%d: SELECT pg_advisory_lock(%d), cancelled while it waits", i, blockedKey)
		m.cancelledWait(i, s)
	case 13, 14: // terminate a backend holding session locks
		desc = m.terminateHolder()
	case 15, 16, 17: // a network fault (modelFaults)
		desc = m.injectFault()
	}
	if desc == "" {
		return
	}
	m.history = append(m.history, desc)
	if err != nil {
		m.fail("%s: %v", desc, err)
	}
}

// literal spells a call with literal keys (for statements of several calls).
func literal(call string, k lockKey) string {
	fn := call[:strings.IndexAny(call, "(")]
	fn = strings.Trim(fn, `"`)
	if k.Pair {
		return fmt.Sprintf("%s(%d, %d)", fn, k.K1, k.K2)
	}
	return fmt.Sprintf("%s(%d)", fn, k.K1)
}

func (m *model) openSlot(i int) *slot {
	if m.slots[i] == nil {
		c, err := m.e.wrapped.Conn(context.Background())
		if err != nil {
			m.fail("opening a slot: %v", err)
		}
		m.slots[i] = &slot{c: c}
	}
	return m.slots[i]
}
