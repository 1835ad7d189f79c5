package lockhooks

// heldView is what the tracking says a connection holds: session locks
// with their counts and the current transaction's locks (for tests).
type heldView struct {
	pid     int32
	session map[lockKey]int
	approx  map[lockKey]bool // session keys whose count may be off
	xact    map[lockKey]int
	lost    bool
	parked  bool
}

// view returns c's tracked locks.
func (c *conn) view() heldView {
	c.pin.Lock()
	defer c.pin.Unlock()
	v := heldView{pid: c.LockPID(), session: map[lockKey]int{}, approx: map[lockKey]bool{}, xact: map[lockKey]int{}, lost: c.pin.Lost != nil, parked: c.pin.Parked}
	for k, l := range c.pin.Held {
		v.session[k] = l.Count
		if l.Approx {
			v.approx[k] = true
		}
	}
	for k, n := range c.pin.Xact {
		v.xact[k] = n
	}
	return v
}
