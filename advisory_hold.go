package lockhooks

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
)

// lockHold is an AdvisoryLock as its server side sees it
// (advisorylock.Hold): how statements run on the connection it keeps. The
// closures handed to sql.Conn.Raw stay in these concrete methods, so that
// they cost no allocation.
type lockHold AdvisoryLock

// String names the lock's connection.
func (h *lockHold) String() string { return h.c.String() }

// FirstRow runs query, with the lock's key as its argument, on the lock's
// connection through the statement hooks, and reads its first row (at
// most len(dest) columns) into dest; n is the number of columns. It calls
// the hooks directly, under database/sql's hold of the connection (Raw):
// the lock and unlock of AcquireAdvisoryLock and Release need none of
// what database/sql's own query path costs (its rows, the conversions of
// Scan, a goroutine per query run with a context that can end).
func (h *lockHold) FirstRow(ctx context.Context, query string, dest []driver.Value) (n int, err error) {
	err = h.conn.Raw(func(any) error {
		h.args[0] = driver.NamedValue{Ordinal: 1, Value: h.lock.Key}
		rows, err := h.c.QueryContext(ctx, query, h.args[:])
		if err != nil {
			return err
		}
		n = len(rows.Columns())
		if n > len(dest) {
			rows.Close()
			return fmt.Errorf("lockhooks: %q returned %d columns, want at most %d", query, n, len(dest))
		}
		if err := rows.Next(dest[:n]); err != nil {
			rows.Close()
			if err == io.EOF {
				err = fmt.Errorf("lockhooks: %q returned no row", query)
			}
			return err
		}
		return rows.Close()
	})
	return n, err
}

// Exec runs query on the lock's connection through database/sql, with the
// lock's key as its argument if withKey.
func (h *lockHold) Exec(ctx context.Context, query string, withKey bool) (err error) {
	if withKey {
		_, err = h.conn.ExecContext(ctx, query, h.lock.Key)
	} else {
		_, err = h.conn.ExecContext(ctx, query)
	}
	return err
}

// UnlockKey runs pg_advisory_unlock of the lock's key through database/sql:
// on the lock's connection, or, throughPool, on the pool (which reroutes
// it to the parked connection that holds the key).
func (h *lockHold) UnlockKey(ctx context.Context, throughPool bool) (ok bool, err error) {
	const unlock = "SELECT pg_advisory_unlock($1)"
	if throughPool {
		err = h.db.QueryRowContext(ctx, unlock, h.lock.Key).Scan(&ok)
	} else {
		err = h.conn.QueryRowContext(ctx, unlock, h.lock.Key).Scan(&ok)
	}
	return ok, err
}

// OwnRow runs query, annotated with the holder's identity
// (pg_identity_publish.go), on the lock's connection under database/sql's
// hold of it, past the statement hooks; a failure that broke the
// connection is reported as the hooks would have (Lost, Err).
func (h *lockHold) OwnRow(ctx context.Context, query string) (row []driver.Value, err error) {
	rerr := h.conn.Raw(func(any) error {
		note, args := h.c.holderNote()
		row, err = h.c.QueryRow(ctx, note+query, args)
		if err != nil && h.c.ConnectionBroken(err) {
			h.c.LoseLocks(err)
		}
		return nil
	})
	if rerr != nil {
		return nil, rerr // the connection was closed before the read (db.Close racing the acquisition)
	}
	return row, err
}

// InTextTx reports whether the lock's connection is in a transaction begun
// by statement text (database/sql's belongs to its *sql.Tx). It is read
// under database/sql's hold of the connection (Raw), never beside a
// statement of another goroutine's.
func (h *lockHold) InTextTx() (textTx bool) {
	h.conn.Raw(func(any) error {
		h.c.pin.Lock()
		textTx = h.c.pin.TextTx && h.c.tx.inner == nil
		h.c.pin.Unlock()
		return nil
	})
	return textTx
}

// Returned reports whether err says the caller closed Conn() already.
func (h *lockHold) Returned(err error) bool { return errors.Is(err, sql.ErrConnDone) }

// Detach takes the lock off its connection (conn.advisory).
func (h *lockHold) Detach() { h.c.advisory.CompareAndSwap((*AdvisoryLock)(h), nil) }

// Settle settles the lock's connection with the registry.
func (h *lockHold) Settle() { h.c.connector.pins.Settle(h.c) }

// Close gives the lock's connection back to the pool.
func (h *lockHold) Close() { h.conn.Close() }
