package pgsession

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
	"github.com/lockhooks/lockhooks/internal/rawconn"
)

// Releasing session locks: a release the connection's own statement made,
// and an unlock sent on another connection of the database, rerouted to
// the parked connection that holds the key.

// ErrNotLockOwner is wrapped by the error returned, instead of Postgres's
// silent false, for a pg_advisory_unlock that cannot be honoured (the
// root package exports it).
var ErrNotLockOwner = errors.New("lockhooks: not the lock's owner")

// SharedSuffix is the suffix of k's functions' names: "_shared" for a
// shared lock.
func SharedSuffix[K Key](k K) string {
	if advisorykey.Key(k).Shared {
		return "_shared"
	}
	return ""
}

// TryQuery returns the statement that tries to take k once.
func TryQuery[K Key](k K) (string, []driver.NamedValue) { return call(k, "pg_try_advisory_lock") }

// UnlockQuery returns the statement that releases k once.
func UnlockQuery[K Key](k K) (string, []driver.NamedValue) { return call(k, "pg_advisory_unlock") }

// call returns "SELECT fn(k)" for k's key form and mode, with k bound.
func call[K Key](key K, fn string) (string, []driver.NamedValue) {
	k := advisorykey.Key(key)
	fn += SharedSuffix(k)
	if k.Pair {
		return "SELECT " + fn + "($1::int4, $2::int4)", []driver.NamedValue{{Ordinal: 1, Value: k.K1}, {Ordinal: 2, Value: k.K2}}
	}
	return "SELECT " + fn + "($1::bigint)", []driver.NamedValue{{Ordinal: 1, Value: k.K1}}
}

// ForgetHeldLocked records one release of k, and the end of its hold
// when it was the last (Host.HoldEnded); State is locked.
func (c *Conn[K]) ForgetHeldLocked(k K) {
	if since, freed := c.ForgetLocked(k); freed {
		c.host.HoldEnded(since)
	}
}

// Forget records one release of k, which changes what the connection
// holds (Gen).
func (c *Conn[K]) Forget(k K) {
	c.Lock()
	c.ForgetHeldLocked(k)
	c.Gen++
	c.UpdateLocked()
	c.Unlock()
}

// Clear records that the connection holds no session lock.
func (c *Conn[K]) Clear() {
	c.Lock()
	c.ClearLocked(c.host.HoldEnded)
	c.UpdateLocked()
	c.Unlock()
}

// UnlockParked runs, on the parked connection, the unlock of k (taken at
// site) that another connection of its database was sent: under its Exec
// mutex, bounded by the check timeout, on its pooler holder through a
// declared transaction pooler. A connection that broke loses its locks;
// an unlock the server answers false is refused (ErrNotLockOwner) and the
// tracking read again. The caller settles the connection afterwards.
func (c *Conn[K]) UnlockParked(ctx context.Context, k K, site string) error {
	ctx, cancel := context.WithTimeout(ctx, c.set.CheckTimeout)
	defer cancel()
	c.Exec.Lock()
	defer c.Exec.Unlock()
	c.Lock()
	closed, held := c.Closed, c.Held[k] != nil
	approx := held && c.Held[k].Approx
	c.Unlock()
	if closed || !held {
		return fmt.Errorf("%w: pg_advisory_unlock%s(%s): the parked connection that held it released it meanwhile", ErrNotLockOwner, SharedSuffix(k), k)
	}
	q, args := UnlockQuery(k)
	var v driver.Value
	var err error
	if c.set.TxPooler {
		var answer *rawconn.Row
		if answer, err = c.Hold.Run(ctx, q, args); err == nil && len(answer.Values()) == 1 {
			v = answer.Values()[0]
		}
	} else {
		// The unlock is the parked holder's last statement from now on:
		// it names the holder of the locks that stay (identity.go).
		if note := c.NoteOwn(&k); note != "" {
			q = note + q
			args = append(append([]driver.NamedValue{}, c.set.Own.Args...), args...)
			for i := range args {
				args[i].Ordinal = i + 1
			}
		}
		v, err = c.host.QueryValue(ctx, q, args...)
	}
	if err != nil {
		if c.host.ConnectionBroken(err) {
			return LostError(c.host.LoseLocks(err), err)
		}
		return fmt.Errorf("lockhooks: rerouting pg_advisory_unlock%s(%s) to %v: %w", SharedSuffix(k), k, c.host, err)
	}
	if ok, _ := v.(bool); !ok {
		c.Reconcile(ctx, site, nil, true)
		return fmt.Errorf("%w: pg_advisory_unlock%s(%s) on %v, which lockhooks believed held it, returned false", ErrNotLockOwner, SharedSuffix(k), k, c.host)
	}
	c.host.UnlockRerouted(ctx)
	c.Forget(k)
	c.Hold.EndIfEmpty()
	if approx {
		// The count may be off: pg_locks says whether the key is still held.
		c.Reconcile(ctx, site, nil, false)
	}
	return nil
}

// NoteOwn is Note for a statement of lockhooks' own on the connection's
// backend, to be sent with Settings.Own's arguments (which keep it out of
// the driver's statement cache): "" where the driver cannot run such
// texts uncached, or through a declared transaction pooler (the
// connection's statements run on any backend; its holder's carry the
// annotation instead).
func (c *Conn[K]) NoteOwn(skip *K) string {
	if !c.set.Own.OK() || c.set.TxPooler {
		return ""
	}
	return c.Note(skip)
}

// ParkedHold is what a connection holds of key k as an unlock rerouted to
// it sees: whether it is parked, and where and when it took k (zero when
// it does not hold it).
func (c *Conn[K]) ParkedHold(k K) (parked bool, site string, since time.Time) {
	c.Lock()
	defer c.Unlock()
	if l := c.Held[k]; l != nil {
		site, since = l.Site, l.Since
	}
	return c.Parked, site, since
}
