package lockorder

// Kind says what a [Report] found.
type Kind int

// What the checker reports.
const (
	// Cycle: lock classes were taken in orders that form a cycle.
	Cycle Kind = iota + 1
	// DescendingIDs (a warning): one transaction took ids of one class in
	// descending order by separate calls.
	DescendingIDs
	// UnorderedRows (a warning): a row-locking query locked more than one
	// row without ORDER BY.
	UnorderedRows
)

// Edge is one observed order: From (taken at FromSite) was held when To
// was taken (at ToSite); the sites are those of the first time the order
// was seen.
type Edge struct {
	From, To         string
	FromSite, ToSite string
}

// Report is one finding of the checker.
type Report struct {
	Kind Kind
	// Classes are a cycle's classes, each taken before the next and the
	// last before the first, or the one class of a warning.
	Classes []string
	// Edges are a cycle's orders, one per consecutive pair of Classes (the
	// last closing the cycle).
	Edges []Edge
	// Site is where a warning's lock was taken; Earlier is where the
	// higher id was taken (DescendingIDs).
	Site, Earlier string
	// Detail says what a warning saw (the ids, the row count).
	Detail string
}
