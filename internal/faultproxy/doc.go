// Package faultproxy is a TCP proxy for tests that injects network faults
// between a client (the database driver) and a server (PostgreSQL or
// PgBouncer): it cuts connections on both sides or on one side only
// (half-open), half-closes them, black-holes them (stops forwarding without
// a word, as a partition does) and delays them, per connection or for every
// connection, and can refuse or stall new connections.
//
// A test points the driver's DSN at [Proxy.Addr] instead of the server. Each
// accepted connection is a [Link]; a link is found by the local port of its
// server-side socket, which is what the server sees as the client's port
// (pg_stat_activity.client_port), so a test can fault exactly the connection
// of a given backend ([Proxy.LinkByServerPort]).
//
// Black-holing stalls a link rather than dropping bytes: nothing is read from
// either socket while it lasts, so each side's writes pile up in the kernel's
// buffers and then block, and its reads wait, as over a network that lost
// every packet; [Link.Resume] lets the stream continue intact, as TCP's
// retransmissions would.
//
// It owns its listener and links. It imports nothing of lockhooks' (only the
// standard library). Only tests import it.
package faultproxy
