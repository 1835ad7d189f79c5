// Package pgtest gives tests a real PostgreSQL database.
//
// It starts one private cluster per test binary from the system's server
// binaries (initdb and pg_ctl on PATH or under /usr/lib/postgresql/*/bin), in a
// temporary directory, on a free loopback port, with durability turned off
// for speed; each test that calls [DSN] gets a fresh database, dropped when
// the test ends, and [Main] stops and removes the cluster when the binary's
// tests are done. A cluster left behind by a test binary that was killed is
// stopped and removed by the next one.
//
// Environment:
//   - LOCKHOOKS_TEST_PG_DSN: use this server instead of starting one (the
//     user must be allowed to create databases);
//   - LOCKHOOKS_REQUIRE_PG=1: fail, instead of skip, when no server can be had
//     (CI sets it);
//   - LOCKHOOKS_REQUIRE_PGBOUNCER=1: fail, instead of skip, when a PgBouncer
//     version cannot be had for [PoolerDSN], [EachPooler] or [StartPooler]
//     (CI sets it);
//   - LOCKHOOKS_PGBOUNCER_1_25: the PgBouncer 1.25 binary (default: where
//     .ci/build-pgbouncer puts it).
//
// [PoolerDSN] is DSN through a real PgBouncer in transaction mode (the
// Debian package's /usr/sbin/pgbouncer, 1.18), started once per test binary
// in front of the server; [EachPooler] runs a test against each PgBouncer
// version of the matrix (1.18, and 1.25 built from source:
// LOCKHOOKS_PGBOUNCER_1_25); [StartPooler] starts one for a single test with
// its own settings (version, session mode, timeouts). See pgbouncer.go for
// what they guarantee.
//
// When the tests run as root (initdb refuses to), the cluster is run as the
// postgres system user through runuser.
//
// It owns the test binary's cluster and PgBouncers (started once, stopped by
// [Main] or [Stop]). It imports internal/testcaps (skipping loudly) and
// internal/tiedproc (children that die with the binary); pgx, only to parse
// DSNs. Only tests import it.
package pgtest
