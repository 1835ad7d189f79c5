package pgblocking

import "github.com/lockhooks/lockhooks/internal/identity"

// index is the database's open connections by number, by the backend pid
// each met at connect, and by the backend of the holder connection each
// keeps through a transaction pooler.
type index[C Conn] struct {
	byID            map[uint64]C
	byPID, byHolder map[int32]C
}

// index returns the database's open connections, indexed.
func (r *Reader[C]) index() index[C] {
	conns := r.cfg.Conns()
	x := index[C]{byID: make(map[uint64]C, len(conns)), byPID: make(map[int32]C, len(conns)), byHolder: map[int32]C{}}
	for _, oc := range conns {
		x.byID[oc.ID()] = oc
		if p := oc.PID(); p != 0 {
			x.byPID[p] = oc
		}
		if p := oc.HolderPID(); p != 0 {
			x.byHolder[p] = oc
		}
	}
	return x
}

// ConnOf returns the connection of the database whose statements backend
// pid runs, as pg_stat_activity shows the backend (application_name app,
// last statement query), if it is one. A backend that shows a lockhooks
// identity is the connection it names (a transaction through a pooler
// runs on any backend); one that shows none is the holder connection a
// connection keeps through a transaction pooler, or the connection that
// met it at connect, unless a transaction pooler is declared or seen (the
// backend serves other clients then) or the backend shows another
// application_name than the connection had (an undeclared pooler gave it
// to another client). A pid is matched only when byPID says the backend
// is on the database's server (pids are per server).
func (r *Reader[C]) ConnOf(pid int32, app, query string, byPID bool) (C, bool) {
	return r.connOf(pid, app, query, r.index(), byPID)
}

// connOf is ConnOf over the index x.
func (r *Reader[C]) connOf(pid int32, app, query string, x index[C], byPID bool) (C, bool) {
	var none C
	if id := identity.Decode(app, query); id != nil {
		if !id.OfThisProcess() || id.Database != r.cfg.Database() {
			return none, false // another process's, or another database's
		}
		oc, ok := x.byID[id.Conn]
		return oc, ok
	}
	if !byPID {
		return none, false
	}
	if oc, ok := x.byHolder[pid]; ok {
		return oc, true
	}
	oc, ok := x.byPID[pid]
	if !ok || r.cfg.TxPooler || app != oc.ConnectApp() {
		return none, false
	}
	if r.cfg.PoolerSeen != nil && r.cfg.PoolerSeen() {
		return none, false // a transaction-mode pooler seen: the backend a connection met at connect serves other clients, as with a declared one
	}
	return oc, true
}
