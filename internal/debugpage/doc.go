// Package debugpage is the /debug/locks page: view, bounds and HTML over
// a snapshot of the model.
//
// Its one job: given what the model shows of each database (a [Report]:
// its held locks, waits in progress with their holders, the wait-for
// graph, its last events and counters), make the page a reader can take
// in at any scale, and its JSON. It keeps the gathering bounded: a
// [Collector] is offered every held lock of a database, under the lock
// tables' mutexes, without allocating per lock, counts them by group and
// keeps only the rows the page or one JSON page ([Query]) shows; call
// sites and key names are formatted only for the rows kept ([Names]).
// [GraphOf] builds the wait-for graph of the waiters, and [Render] writes
// the page: a summary for the whole process, then each database, every
// list bounded and what is left out counted. [Handler] serves it, HTML or
// JSON, over the databases its caller resolves as [Source]s.
//
// Reading the model (connections, lock tables, the writer lock, the
// server's blockers) is internal/lockdb's business (a [Source]), finding
// the databases the root's: each builds what it knows and hands it here.
//
// State: none; a Collector lives for one page load.
//
// Imports: internal/holders (the model's values: holders, blockers,
// events), internal/advisorykey (the model's key value, its number as
// Postgres shows it) and internal/callsite (the stacks of the rows kept,
// named lazily); nothing else of lockhooks'.
package debugpage
