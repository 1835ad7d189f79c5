package lockhooks

import (
	"strconv"
	"strings"
	"sync"

	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/lockset"
)

// Names of advisory-lock keys. An advisory key is a number; the name it
// was made from is what a reader knows. [LockID] remembers the names it
// hashed, and Lock on Postgres the (namespace, id) each of its keys was
// derived from, so that the debug page, its JSON, the slow-wait log,
// errors and spans show "nightly-report (4290127349813372591)" instead
// of the bare number. describeKey is the one function that formats a key
// for a reader; call it (or lockKey.String) wherever a key is shown.

// keyNameCapacity bounds the memory of names: at most two generations of
// this many keys are remembered (a few hundred KB). When the current
// generation is full it becomes the old one and the one before is
// forgotten, so the names in use stay known (a lookup in the old
// generation, done by LockID itself, copies the name forward).
const keyNameCapacity = 4096

// keyNameMaxLen bounds one remembered name; a longer one is kept
// truncated (the key, a hash of the whole name, is unaffected).
const keyNameMaxLen = 200

// keyNames is the process-wide memory of key names. It is the package's
// one piece of global mutable state beyond what sql.Register forces:
// LockID sees no database, so its names cannot live in one. It is
// bounded (keyNameCapacity), holds only names (never arguments or
// statement text), and costs LockID a read-locked map lookup when the
// name is already known, one insertion when it is not.
var keyNames nameMemory

// nameMemory maps advisory keys to the names they were made from.
type nameMemory struct {
	mu       sync.RWMutex
	cur, old map[int64]string
}

// remember records that key k was made from name.
func (m *nameMemory) remember(k int64, name string) {
	if len(name) > keyNameMaxLen {
		name = holders.Truncate(name, keyNameMaxLen)
	}
	m.mu.RLock()
	known, ok := m.cur[k]
	m.mu.RUnlock()
	if ok && known == name {
		return
	}
	name = strings.Clone(name) // never keep a caller's larger buffer alive
	m.mu.Lock()
	if m.cur == nil || len(m.cur) >= keyNameCapacity {
		m.old, m.cur = m.cur, make(map[int64]string, 64)
	}
	m.cur[k] = name
	m.mu.Unlock()
}

// lookup returns the name key k was made from, if remembered.
func (m *nameMemory) lookup(k int64) (string, bool) {
	m.mu.RLock()
	name, ok := m.cur[k]
	if !ok {
		name, ok = m.old[k]
	}
	m.mu.RUnlock()
	return name, ok
}

// keyOrigin is what an advisory key was made from: a LockID name, or the
// namespace and id of a Lock on Postgres.
type keyOrigin struct {
	name      string // LockID's argument (lockset false)
	lockset   bool   // the key is one of Lock's: namespace and id are set
	namespace string
	cid       string // the id, canonical (see lockset.CanonicalIDs)
}

// originOf returns what key k was made from, if lockhooks saw it.
func originOf(k int64) (keyOrigin, bool) {
	name, ok := keyNames.lookup(k)
	if !ok {
		return keyOrigin{}, false
	}
	// Lock's keys are LockID(namespace + "\x00" + canonical id).
	if i := strings.IndexByte(name, 0); i >= 0 && lockset.ValidID(name[i+1:]) {
		return keyOrigin{lockset: true, namespace: name[:i], cid: name[i+1:]}, true
	}
	return keyOrigin{name: name}, true
}

// label is the origin as a reader names it: the LockID name, or
// "namespace / id".
func (o keyOrigin) label() string {
	if o.lockset {
		return o.namespace + " / " + lockset.DescribeID(o.cid)
	}
	return o.name
}

// describeKey formats advisory key k for a reader: "name (k)" when
// lockhooks knows the name it was made from (LockID's argument, or Lock's
// "namespace / id"), else the number alone. Every place that shows a key
// (the debug page and its JSON, the slow-wait log, errors, events, span
// attributes) formats it here.
func describeKey(k int64) string {
	n := strconv.FormatInt(k, 10)
	if o, ok := originOf(k); ok {
		return o.label() + " (" + n + ")"
	}
	return n
}
