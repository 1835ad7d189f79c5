// Package retry holds RunInTx's machinery outside database/sql: its
// configuration and defaults ([Config], [Defaults]), the jittered backoff
// between attempts ([Backoff]) and its wait, cut short when the context
// ends ([Sleep]), which errors another attempt may not meet
// ([Config.Retryable], [Transient]), and what a failed COMMIT means
// ([Config.CommitFailed]): one that the server rejected, one cut off
// before it could be sent, and one whose reply was lost, which is resolved
// by asking the server about the transaction's id (pg_xact_status) over a
// small interface ([Server]) on another connection. The id itself is
// learnt at BEGIN by the wrapped connection, which reads the attempt's
// [CommitInfo] from BeginTx's context ([InfoOf]).
//
// The loop itself is here too, over an adapter's transaction type: the
// attempts, their backoff and when the loop stops ([Config.Loop], over
// the adapter as [Attempts], ending in an [Outcome]), and one attempt's
// begin, fn, transaction id, COMMIT and the classification of each step's
// error ([RunAttempt], over the adapter's transaction as a [Tx]). The
// adapters are the root's RunInTx over *sql.Tx (and, to come, a pgx
// pool's); the exported options and the error that reports the attempts
// stay with RunInTx in the root package.
//
// State: none of its own; a [Config] is one call's value, a [CommitInfo]
// one attempt's.
//
// Imports: internal/dberr only, of this module (and not database/sql or
// its driver package: the root runs the statements).
package retry
