package keynames

import (
	"strconv"
	"strings"
	"sync"

	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/lockset"
)

// Capacity bounds a Memory: at most two generations of this many keys are
// remembered (a few hundred KB). When the current generation is full it
// becomes the old one and the one before is forgotten, so the names in
// use stay known (a name found only in the old generation is copied
// forward when it is remembered again).
const Capacity = 4096

// MaxLen bounds one remembered name; a longer one is kept truncated (the
// key, a hash of the whole name, is unaffected).
const MaxLen = 200

// Memory maps advisory keys to the names they were made from. Its zero
// value is empty and ready; it costs a read-locked map lookup to remember
// a name already known, one insertion otherwise.
type Memory struct {
	mu       sync.RWMutex
	cur, old map[int64]string
}

// Remember records that key k was made from name.
func (m *Memory) Remember(k int64, name string) {
	if len(name) > MaxLen {
		name = holders.Truncate(name, MaxLen)
	}
	m.mu.RLock()
	known, ok := m.cur[k]
	m.mu.RUnlock()
	if ok && known == name {
		return
	}
	name = strings.Clone(name) // never keep a caller's larger buffer alive
	m.mu.Lock()
	if m.cur == nil || len(m.cur) >= Capacity {
		m.old, m.cur = m.cur, make(map[int64]string, 64)
	}
	m.cur[k] = name
	m.mu.Unlock()
}

// Lookup returns the name key k was made from, if remembered.
func (m *Memory) Lookup(k int64) (string, bool) {
	m.mu.RLock()
	name, ok := m.cur[k]
	if !ok {
		name, ok = m.old[k]
	}
	m.mu.RUnlock()
	return name, ok
}

// Origin is what an advisory key was made from: a LockID name, or the
// namespace and id of a lockset key on Postgres.
type Origin struct {
	Name      string // LockID's argument (Lockset false)
	Lockset   bool   // the key is a lockset's: Namespace and ID are set
	Namespace string
	ID        string // the id, canonical (see lockset.CanonicalIDs)
}

// Origin returns what key k was made from, if remembered.
func (m *Memory) Origin(k int64) (Origin, bool) {
	name, ok := m.Lookup(k)
	if !ok {
		return Origin{}, false
	}
	// A lockset's keys are LockID(namespace + "\x00" + canonical id).
	if i := strings.IndexByte(name, 0); i >= 0 && lockset.ValidID(name[i+1:]) {
		return Origin{Lockset: true, Namespace: name[:i], ID: name[i+1:]}, true
	}
	return Origin{Name: name}, true
}

// Label is the origin as a reader names it: the LockID name, or
// "namespace / id".
func (o Origin) Label() string {
	if o.Lockset {
		return o.Namespace + " / " + lockset.DescribeID(o.ID)
	}
	return o.Name
}

// Describe formats advisory key k for a reader: "name (k)" when the name
// it was made from is remembered (LockID's argument, or a lockset's
// "namespace / id"), else the number alone.
func (m *Memory) Describe(k int64) string {
	n := strconv.FormatInt(k, 10)
	if o, ok := m.Origin(k); ok {
		return o.Label() + " (" + n + ")"
	}
	return n
}
