// Package pgblocking is who blocks whom among one Postgres database's
// connections, as the server shows it: the connections that wait on the
// server and, for each, the backends pg_blocking_pids names, followed to
// the root of the chain (A holds, C waits for A, B waits behind C: B's
// holder is A, and C is queued ahead of it), read in one statement on the
// database's side connection ([Reader.Blocked]); which of the database's
// connections a backend is, by the identity it published or by the
// backend it met at connect ([Reader.ConnOf]); who holds given advisory
// keys now ([Reader.KeyHolders]); a backend the server showed blocking a
// wait as the model's holder: this process's connection as the caller
// names it, another process's as its published identity says
// ([Identify], [HolderOf]); and the probe of a wait that may be a
// self-wait, which asks whether a backend waits for a given holder and
// cancels its statement in the same statement if so ([Reader.Probe]);
// and what the server still shows of a deadlock's backends and relations
// ([Reader.DeadlockFacts]). It
// feeds the model of holders: the slow-wait log, the wait spans, the
// errors of waits that time out, deadlocks and the debug page.
//
// The connections are the caller's own type ([Conn]); the package keeps
// no state of them, only the read in flight, which callers arriving while
// it runs share when it covers their connections (sixty page loads at
// once make one or two reads, not sixty). Those shared reads are bounded
// by the configured timeout and by the side connection's close, not by a
// caller's context; the read of a key's holders is bounded by its
// caller's.
//
// It may import internal/pgserver (the statements and their rows),
// internal/rawconn (the side connection), internal/identity (decoding
// what a backend shows), internal/pgdriver and internal/holders and
// internal/advisorykey (the values), never the SQL scanner, the
// session-lock machine or the root.
package pgblocking
