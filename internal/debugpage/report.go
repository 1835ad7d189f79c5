package debugpage

import (
	"time"

	"github.com/lockhooks/lockhooks/internal/holders"
)

// Report is the page's data, and the JSON of ?format=json.
type Report struct {
	Generated time.Time  `json:"generated"`
	Databases []Database `json:"databases"`
}

// Database is what one database shows.
type Database struct {
	Index   int      `json:"index"`
	Dialect string   `json:"dialect,omitempty"`
	Pool    string   `json:"pool,omitempty"`  // its pool name (WithPoolName), as holders name it
	Error   string   `json:"error,omitempty"` // the database could not be shown
	Notes   []string `json:"notes,omitempty"` // what could not be read this time
	// Held: the top rows of each group of held locks (HeldGroups), the
	// locks others wait for first, then the oldest; HeldTotal counts all.
	Held         []Held           `json:"held"`
	HeldGroups   []Group          `json:"held_groups"`
	HeldTotal    int              `json:"held_total"`
	Waiters      []Waiter         `json:"waiters"`       // the oldest waits in progress, at most MaxWaiters
	WaitersTotal int              `json:"waiters_total"` // all waits in progress
	Graph        Graph            `json:"graph"`
	Events       []holders.Event  `json:"events"`
	Counters     map[string]int64 `json:"counters"`
}

// Held is one held lock.
type Held struct {
	Kind        string    `json:"kind"`  // advisory | lockset | sqlite_writer
	Mode        string    `json:"mode"`  // exclusive | shared
	Scope       string    `json:"scope"` // session | transaction
	Namespace   string    `json:"namespace,omitempty"`
	Key         string    `json:"key"`                    // the lockset id, or the advisory key
	AdvisoryKey string    `json:"advisory_key,omitempty"` // Lock on Postgres: the advisory key it took for the id
	Name        string    `json:"name,omitempty"`         // the name LockID made the key from
	Conn        uint64    `json:"conn"`
	PID         int32     `json:"pid,omitempty"`
	State       string    `json:"state"` // in use | parked
	Since       time.Time `json:"since,omitzero"`
	HeldSeconds float64   `json:"held_seconds,omitempty"`
	Site        string    `json:"site,omitempty"` // where it was taken
	Statement   string    `json:"statement,omitempty"`
	Count       int       `json:"count"`             // re-entrant acquisitions
	Waiters     int       `json:"waiters,omitempty"` // waits in progress for it
}

// Waiter is one wait in progress.
type Waiter struct {
	Kind        string            `json:"kind"` // advisory | row | lockset | sqlite_writer | server
	Mode        string            `json:"mode,omitempty"`
	Scope       string            `json:"scope,omitempty"`
	Namespace   string            `json:"namespace,omitempty"`
	Keys        string            `json:"keys,omitempty"`
	Conn        uint64            `json:"conn,omitempty"`
	PID         int32             `json:"pid,omitempty"`
	Since       time.Time         `json:"since,omitzero"`
	WaitSeconds float64           `json:"wait_seconds"`
	Site        string            `json:"site,omitempty"`      // where the wait was asked for
	Statement   string            `json:"statement,omitempty"` // statement text, never its arguments
	WaitEvent   string            `json:"wait_event,omitempty"`
	Holders     []holders.Holder  `json:"holders"`
	Blockers    []holders.Blocker `json:"blockers"`
	QueuedAhead int               `json:"queued_ahead,omitempty"` // backends queued ahead of it on the server (waiting themselves): at most pgserver.MaxQueuedListed are listed
}

// Graph is the wait-for graph: an edge from a waiter to what it waits
// for.
type Graph struct {
	Nodes []Node `json:"nodes"`
	Edges []Edge `json:"edges"`
	Cycle bool   `json:"cycle"` // an in-process cycle: these waits end only by timeout
}

// Node is a connection of the database, or a backend outside it.
type Node struct {
	ID       string `json:"id"` // "conn-N" or "pid-N"
	Label    string `json:"label"`
	Detail   string `json:"detail,omitempty"`
	External bool   `json:"external"`
}

// Edge is one wait-for relation.
type Edge struct {
	From    string `json:"from"`
	To      string `json:"to"`
	Label   string `json:"label"`
	InCycle bool   `json:"in_cycle"`
}

// Group is one group of held locks (one kind and namespace) on the page
// and in the JSON.
type Group struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace,omitempty"`
	Count     int    `json:"count"`          // locks held in the group
	Shown     int    `json:"shown"`          // of them listed in "held" (the top rows)
	Waiters   int    `json:"waiters"`        // waits in progress for them
	Pages     string `json:"pages,omitzero"` // the query string of the group's JSON pages (all its locks)
	Other     bool   `json:"other,omitzero"` // locks of namespaces beyond the page's group limit, counted only
	// Holders: how many of the group's locks each connection holds, the
	// most first (at most RowsPerGroup connections).
	Holders []GroupHolder `json:"holders,omitempty"`
}

// GroupHolder is a connection holding locks of a group.
type GroupHolder struct {
	Conn  uint64 `json:"conn"`
	Count int    `json:"count"`
}

// HeldPage is one JSON page of a group's held locks, in key order.
type HeldPage struct {
	Generated time.Time `json:"generated"`
	Database  int       `json:"database"`
	Kind      string    `json:"kind"`
	Namespace string    `json:"namespace,omitempty"`
	Count     int       `json:"count"` // locks held in the group now
	Held      []Held    `json:"held"`
	Next      string    `json:"next,omitempty"` // the query string of the next page; absent on the last
}
