package telemetry

import (
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/lockhooks/lockhooks/internal/holders"
)

// HolderAttrs are h's attributes on a wait span (and its link).
func HolderAttrs(h holders.Holder) []attribute.KeyValue {
	site := h.Site
	if site == "" && h.Running && h.Statement != "" {
		site = "statement " + strconv.Quote(holders.Truncate(h.Statement, 120))
	}
	attrs := []attribute.KeyValue{AttrHolderSite.String(site)}
	if !h.Since.IsZero() {
		attrs = append(attrs, AttrHolderSince.String(h.Since.UTC().Format(time.RFC3339Nano)),
			AttrHolderHeldSeconds.Float64(time.Since(h.Since).Round(time.Millisecond).Seconds()))
	}
	if h.PID != 0 {
		attrs = append(attrs, AttrHolderPID.Int64(int64(h.PID)))
	}
	if h.Process != "" {
		attrs = append(attrs, AttrHolderProcess.String(h.Process))
	}
	if h.Database != "" {
		attrs = append(attrs, AttrHolderPool.String(h.Database))
	}
	if h.Conn != 0 {
		attrs = append(attrs, AttrHolderConn.Int64(int64(h.Conn)))
	}
	return attrs
}

// BlockersEvent is the attributes of a wait span's lockhooks.lock.blockers
// event: the backends that block the wait of backend pid directly, as
// Postgres showed them at at (server), those queued ahead, and the backend
// at the root of the chain (rootPID, when hasRoot).
func BlockersEvent(pid int32, server []holders.Blocker, at time.Time, rootPID int32, hasRoot bool) []attribute.KeyValue {
	var pids, queued []int64
	var states, starts, queries, apps []string
	for _, x := range server {
		if x.Waiting {
			queued = append(queued, int64(x.PID))
		}
		if x.Depth > 1 {
			continue
		}
		start := ""
		if x.XactSeconds >= 0 {
			start = at.Add(-time.Duration(x.XactSeconds * float64(time.Second))).UTC().Format(time.RFC3339Nano)
		}
		pids, states, starts = append(pids, int64(x.PID)), append(states, x.State), append(starts, start)
		queries, apps = append(queries, holders.Truncate(x.Query, 200)), append(apps, x.ApplicationName)
	}
	attrs := []attribute.KeyValue{
		AttrBackendPID.Int64(int64(pid)),
		attribute.Int64Slice("lockhooks.blocker.backend_pids", pids),
		attribute.StringSlice("lockhooks.blocker.states", states),
		attribute.StringSlice("lockhooks.blocker.xact_starts", starts),
		attribute.StringSlice("lockhooks.blocker.queries", queries),
		attribute.StringSlice("lockhooks.blocker.application_names", apps),
	}
	if len(queued) > 0 {
		attrs = append(attrs, attribute.Int64Slice("lockhooks.blocker.queued_pids", queued))
	}
	if hasRoot {
		attrs = append(attrs, attribute.Int64("lockhooks.blocker.root_pid", int64(rootPID)))
	}
	return attrs
}

// UnknownBlocker is the attributes a wait span gets for the backend at the
// root of its chain when nobody identified it: its pid, the model's
// description of it, and how long its transaction has run, when known.
func UnknownBlocker(x holders.Blocker) []attribute.KeyValue {
	attrs := []attribute.KeyValue{AttrHolderPID.Int64(int64(x.PID)), AttrHolderDescription.String(x.String())}
	if x.XactSeconds >= 0 {
		attrs = append(attrs, AttrHolderHeldSeconds.Float64(x.XactSeconds))
	}
	return attrs
}
