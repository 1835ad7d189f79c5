// Package lockorder remembers in which order lock classes are taken and
// reports an order that inverts one seen before, or closes a cycle of any
// length, together with two warnings of the same family: ids of one class
// taken in descending order by separate calls, and rows locked without
// ORDER BY.
//
// A lock class is a name the caller gives ("table accounts", `lockset
// "jobs"`, "advisory key 7"); the package neither parses statements nor
// knows connections. Its state is a [Graph]: the orders observed so far
// and the findings already reported, owned by one database (or by every
// database that shares one checker) and safe for concurrent use. The locks
// a transaction or a connection holds stay in the caller's own records,
// each of which carries a [Lock], the checker's view of it.
//
// It imports no package of this module.
package lockorder
