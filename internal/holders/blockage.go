package holders

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// A Blockage is who holds what a wait waits for, as the model names it:
// the holders (connections of lockhooks databases, here or in other
// processes), the backends nobody identified, and what the server showed.
// The slow-wait log, errors, spans and the page only format it.
type Blockage struct {
	Holders  []Holder  // the holders at the root first, then those queued ahead of the wait
	Blockers []Blocker // backends nobody identified, the root first
	Server   []Blocker // every backend of the chain, as Postgres showed it (nil: not read)
	Queued   int       // how many backends block the wait directly while waiting themselves, listed in Server or not
	Err      error     // reading the server failed
	At       time.Time // when it was read
}

// Empty reports whether nobody was found (b nil: nobody looked).
func (b *Blockage) Empty() bool { return b == nil || len(b.Holders)+len(b.Blockers) == 0 }

// Add identifies the backends Postgres showed blocking a wait: each one
// identify names (a connection of a lockhooks database) becomes a holder,
// unless already named; the others stay blockers. Holders at the root
// come before queued ones.
func (b *Blockage) Add(server []Blocker, identify func(Blocker) (Holder, bool)) {
	b.Server = append(b.Server, server...)
	for _, s := range server {
		h, ok := identify(s)
		if !ok {
			b.Blockers = append(b.Blockers, s)
			continue
		}
		if !slices.ContainsFunc(b.Holders, h.SameConnection) {
			b.Holders = append(b.Holders, h)
		}
	}
	sort.SliceStable(b.Holders, func(i, j int) bool { return !b.Holders[i].Queued && b.Holders[j].Queued })
	sort.SliceStable(b.Blockers, func(i, j int) bool { return !b.Blockers[i].Waiting && b.Blockers[j].Waiting })
}

// Root is the holder at the root, the first one not queued.
func (b *Blockage) Root() (Holder, bool) {
	for _, h := range b.Holders {
		if !h.Queued {
			return h, true
		}
	}
	return Holder{}, false
}

// RootBlocker is the first blocker not waiting itself.
func (b *Blockage) RootBlocker() (Blocker, bool) {
	for _, x := range b.Blockers {
		if !x.Waiting {
			return x, true
		}
	}
	return Blocker{}, false
}

// RootPID is the backend at the root of the chain: the root holder's
// (when it names one), else the root blocker's; ok is false when neither
// is known.
func (b *Blockage) RootPID() (pid int32, ok bool) {
	if h, ok := b.Root(); ok && h.PID != 0 {
		return h.PID, true
	}
	if x, ok := b.RootBlocker(); ok {
		return x.PID, true
	}
	return 0, false
}

// Aged is b with the ages the server gave brought up to now (the holders'
// ages count from their Since).
func (b *Blockage) Aged() *Blockage {
	d := time.Since(b.At).Seconds()
	out := *b
	out.Holders = slices.Clone(b.Holders)
	for i := range out.Holders {
		if out.Holders[i].Queued && out.Holders[i].WaitSeconds > 0 {
			out.Holders[i].WaitSeconds += d
		}
	}
	out.Blockers = slices.Clone(b.Blockers)
	for i := range out.Blockers {
		out.Blockers[i] = out.Blockers[i].Aged(d)
	}
	return &out
}

// String is the holder part of a slow-wait line or an error: the holders
// at the root, then the backends queued ahead of the wait.
func (b *Blockage) String() string {
	var parts, queued []string
	for _, h := range b.Holders {
		if h.Queued {
			queued = append(queued, h.String())
		} else {
			parts = append(parts, h.String())
		}
	}
	for _, x := range b.Blockers {
		if x.Waiting {
			queued = append(queued, x.String())
		} else {
			parts = append(parts, x.String())
		}
	}
	if len(queued) > 0 {
		parts = append(parts, "queued ahead of this wait, waiting too: "+strings.Join(queued, "; "))
	}
	if n := b.QueuedUnlisted(); n > 0 {
		parts = append(parts, fmt.Sprintf("and %d more queued ahead (not listed)", n))
	}
	if b.Err != nil {
		parts = append(parts, "(reading pg_blocking_pids failed: "+b.Err.Error()+")")
	}
	if len(parts) == 0 {
		return "unknown"
	}
	return strings.Join(parts, "; ")
}

// QueuedUnlisted is how many of the backends queued ahead of the wait the
// server's read counted but did not list.
func (b *Blockage) QueuedUnlisted() int {
	n := b.Queued
	for _, s := range b.Server {
		if s.Waiting && s.Depth == 1 {
			n--
		}
	}
	return max(n, 0)
}

// LogArgs are the slow-wait line's attributes of the holder at the root,
// the backends nobody identified that block the wait directly
// (blocking_pids) and the backends queued ahead (queued_pids).
func (b *Blockage) LogArgs() []any {
	text := b.String()
	var args []any
	if h, ok := b.Root(); ok {
		args = h.LogArgs()
		if len(b.Holders) > 1 || len(b.Blockers) > 0 {
			args = append(args, "holders", text)
		}
	} else {
		args = []any{"holder", text}
		if x, ok := b.RootBlocker(); ok {
			args = append(args, "holder_pid", x.PID)
			if x.XactSeconds >= 0 {
				args = append(args, "holder_age", time.Duration(x.XactSeconds*float64(time.Second)).Round(time.Millisecond).String())
			}
		}
	}
	var direct, queued []string
	for _, x := range b.Blockers {
		if x.Depth <= 1 {
			direct = append(direct, strconv.Itoa(int(x.PID)))
		}
	}
	for _, s := range b.Server {
		if s.Waiting {
			queued = append(queued, strconv.Itoa(int(s.PID)))
		}
	}
	if len(direct) > 0 {
		args = append(args, "blocking_pids", strings.Join(direct, ","))
	}
	if len(queued) > 0 {
		args = append(args, "queued_pids", strings.Join(queued, ","))
	}
	return args
}
