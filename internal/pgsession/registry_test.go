package pgsession

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
)

// namedKey is a key that names itself, as the root's does.
type namedKey advisorykey.Key

func (k namedKey) String() string { return "key " + advisorykey.Key(k).Number() }

// member is a connection as the registry sees it, without a server: the
// registry's bookkeeping (which holders it keeps, which it closes, what
// db.Close reports) needs none. The monitor, which asks the server, is
// tested at the root against a real one.
type member struct {
	st     State[namedKey]
	id     uint64
	closed int
	lost   []string
}

func (m *member) String() string               { return fmt.Sprintf("connection #%d", m.id) }
func (m *member) Session() *State[namedKey]    { return &m.st }
func (m *member) ID() uint64                   { return m.id }
func (m *member) PID() int32                   { return int32(100 + m.id) }
func (m *member) LockPID() int32               { return m.PID() }
func (m *member) Acquiring() bool              { return true } // keeps the monitor's first look back
func (m *member) Answers(context.Context) bool { return true }
func (m *member) VerifyParked(context.Context) {}
func (m *member) PoolerDetected(what string) error {
	return fmt.Errorf("%v %s", m, what)
}
func (m *member) CloseInner() error {
	m.st.Lock()
	defer m.st.Unlock()
	if !m.st.Closed {
		m.st.Closed = true
		m.closed++
	}
	return nil
}
func (m *member) MarkLost(why string, _ error, _ LossFlags) error {
	m.st.Lock()
	defer m.st.Unlock()
	if len(m.st.Held) == 0 {
		return nil
	}
	m.lost = append(m.lost, why)
	m.st.Lost = errors.New(why)
	m.st.Held = nil
	return m.st.Lost
}

// hold has m take key k (Parked as given).
func (m *member) hold(k int64, parked bool) {
	m.st.Lock()
	m.st.AddLocked(namedKey{K1: k}, "app.go:7", noSpan, 1)
	m.st.Parked = parked
	m.st.Unlock()
}

func newTestRegistry(open map[uint64]*member) *Registry[namedKey, *member] {
	return NewRegistry[namedKey](Config[*member]{
		CheckInterval: time.Hour,
		Settings:      Settings{CheckTimeout: time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))},
		Connect:       func(context.Context) (driver.Conn, error) { return nil, errors.New("no server in this test") },
		OpenConn:      func(id uint64) (*member, bool) { m, ok := open[id]; return m, ok },
		LongHold:      func(string) {},
	})
}

// twoHolders returns a registry with two holders settled: connection #1
// in use with key k1, connection #2 parked with key k2.
func twoHolders(k1, k2 int64) (p *Registry[namedKey, *member], inUse, parked *member) {
	p = newTestRegistry(nil)
	inUse, parked = &member{id: 1}, &member{id: 2}
	inUse.hold(k1, false)
	parked.hold(k2, true)
	p.Settle(inUse)
	p.Settle(parked)
	return p, inUse, parked
}

// A connection that holds a lock is registered when settled; the one to
// reroute an unlock to is a parked holder before one in use; a parked
// connection that holds nothing more is closed, once, and forgotten.
func TestRegistrySettle(t *testing.T) {
	p, inUse, parked := twoHolders(7, 7)
	if !p.Registered(inUse) || !p.Registered(parked) || !p.MonitorRunning() {
		t.Fatalf("registered %v, %v, monitor %v; want both, and a monitor", p.Registered(inUse), p.Registered(parked), p.MonitorRunning())
	}
	if h, ok := p.HolderOf(namedKey{K1: 7}, inUse); !ok || h != parked {
		t.Errorf("HolderOf(7) = %v, %v; want the parked holder", h, ok)
	}
	if h, ok := p.HolderOf(namedKey{K1: 7}, parked); !ok || h != inUse {
		t.Errorf("HolderOf(7) except the parked one = %v, %v; want the one in use", h, ok)
	}
	if _, ok := p.HolderOf(namedKey{K1: 8}, nil); ok {
		t.Error("HolderOf(8) found a holder")
	}
	if held, parkedN := p.Observe(); held != 2 || parkedN != 1 {
		t.Errorf("Observe = %d, %d; want 2 held, 1 parked", held, parkedN)
	}

	parked.st.Lock()
	parked.st.ForgetLocked(namedKey{K1: 7})
	parked.st.Unlock()
	p.Settle(parked)
	p.Settle(parked)
	if p.Registered(parked) || parked.closed != 1 {
		t.Errorf("a parked connection that holds nothing: registered %v, closed %d times; want forgotten, closed once", p.Registered(parked), parked.closed)
	}
	p.Unregister(inUse)
	if p.Registered(inUse) {
		t.Error("Unregister kept the connection")
	}
	p.Close()
	if p.MonitorRunning() || !p.IsClosed() {
		t.Errorf("after Close: monitor %v, closed %v", p.MonitorRunning(), p.IsClosed())
	}
}

// db.Close loses every holder's locks, reports what it released, stops
// the monitor and closes Closing; a later settle starts no monitor.
func TestRegistryClose(t *testing.T) {
	p, a, b := twoHolders(1, 2)
	released := p.Close()
	if len(released) != 2 || !strings.Contains(strings.Join(released, "\n"), "key 1 on connection #1 (in use, taken at app.go:7") ||
		!strings.Contains(strings.Join(released, "\n"), "key 2 on connection #2 (parked, taken at app.go:7") {
		t.Errorf("released %q", released)
	}
	if len(a.lost) != 1 || len(b.lost) != 1 || b.closed != 1 || a.closed != 0 {
		t.Errorf("lost %q, %q; closed %d, %d: want both lost, the parked one closed", a.lost, b.lost, a.closed, b.closed)
	}
	select {
	case <-p.Closing():
	default:
		t.Error("Closing is open after Close")
	}
	c := &member{id: 3}
	c.hold(3, false)
	p.Settle(c)
	if p.MonitorRunning() {
		t.Error("a monitor started after Close")
	}
}

// A marker names its database's connection; another database's marker,
// or one of no open connection, names none. An undeclared pooler's proof
// is kept once; a declared pooler's is not kept at all.
func TestRegistryMarkersAndPooler(t *testing.T) {
	m := &member{id: 9}
	p := newTestRegistry(map[uint64]*member{9: m})
	if o, ok := p.OwnerOf(p.Marker(9)); !ok || o != m {
		t.Errorf("OwnerOf(Marker(9)) = %v, %v", o, ok)
	}
	if _, ok := p.OwnerOf(p.Marker(10)); ok {
		t.Error("a marker of no open connection has an owner")
	}
	other := newTestRegistry(map[uint64]*member{9: m})
	if _, ok := p.OwnerOf(other.Marker(9)); ok {
		t.Error("another database's marker has an owner here")
	}
	if !strings.HasPrefix(p.Marker(9), MarkerPrefix) {
		t.Errorf("marker %q lacks the prefix", p.Marker(9))
	}

	first, second := errors.New("first"), errors.New("second")
	p.SawPooler(first)
	p.SawPooler(second)
	if got := p.PoolerSeen(); got != first {
		t.Errorf("PoolerSeen = %v, want the first proof", got)
	}
	declared := NewRegistry[namedKey](Config[*member]{Settings: Settings{TxPooler: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}})
	declared.SawPooler(first)
	if got := declared.PoolerSeen(); got != nil {
		t.Errorf("with a declared pooler, PoolerSeen = %v", got)
	}
}
