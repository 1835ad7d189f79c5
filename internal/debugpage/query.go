package debugpage

import (
	"bytes"
	"encoding/base64"
	"errors"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// The JSON pages of held locks.

// A Query selects one JSON page of held locks: one group of database DB,
// in key order, after a position.
type Query struct {
	DB       int // the index of the database among the handler's
	group    heldGroupKey
	after    heldPos
	hasAfter bool
	limit    int
}

// ParseQuery reads ?db=&kind=&namespace=&after=&limit= of a handler of
// ndb databases; the bool is false when the request asks for the summary
// instead.
func ParseQuery(q url.Values, ndb int) (*Query, bool, error) {
	if !q.Has("kind") {
		return nil, false, nil
	}
	hq := &Query{group: heldGroupKey{q.Get("kind"), q.Get("namespace")}, limit: 1000}
	if s := q.Get("db"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 || n >= ndb {
			return nil, true, errors.New("lockhooks: db must be the index of one of the databases given to DebugHandler")
		}
		hq.DB = n
	}
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return nil, true, errors.New("lockhooks: limit must be a positive number")
		}
		hq.limit = min(n, PageLimit)
	}
	if s := q.Get("after"); s != "" {
		p, err := decodeHeldCursor(s)
		if err != nil {
			return nil, true, err
		}
		hq.after, hq.hasAfter = p, true
	}
	return hq, true, nil
}

// encodeHeldCursor and decodeHeldCursor turn a position into the opaque
// after= of the next page.
func encodeHeldCursor(p heldPos) string {
	var b bytes.Buffer
	b.WriteString(base64.RawURLEncoding.EncodeToString([]byte(p.cid)))
	for _, n := range []int64{p.k1, p.k2, int64(boolInt(p.shared)), int64(p.conn)} {
		b.WriteByte('.')
		b.WriteString(strconv.FormatInt(n, 10))
	}
	return b.String()
}

func decodeHeldCursor(s string) (heldPos, error) {
	bad := errors.New("lockhooks: after must be the cursor of a previous page's next")
	parts := strings.Split(s, ".")
	if len(parts) != 5 {
		return heldPos{}, bad
	}
	cid, err := base64.RawURLEncoding.DecodeString(parts[0])
	if err != nil {
		return heldPos{}, bad
	}
	var n [4]int64
	for i := range n {
		if n[i], err = strconv.ParseInt(parts[i+1], 10, 64); err != nil {
			return heldPos{}, bad
		}
	}
	return heldPos{cid: string(cid), k1: n[0], k2: n[1], shared: n[2] == 1, conn: uint64(n[3])}, nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Page formats the JSON page the collector gathered (NewCollector with a
// Query).
func (hc *Collector) Page(now time.Time) HeldPage {
	q := hc.page
	p := HeldPage{Generated: now.UTC(), Database: q.DB, Kind: q.group.kind, Namespace: q.group.namespace, Held: []Held{}}
	g := hc.groups[q.group]
	if g == nil {
		return p
	}
	p.Count = g.count
	kept := g.top.sorted()
	if len(kept) > q.limit {
		kept = kept[:q.limit]
		v := url.Values{"format": {"json"}, "db": {strconv.Itoa(q.DB)}, "kind": {q.group.kind},
			"after": {encodeHeldCursor(kept[len(kept)-1].pos())}, "limit": {strconv.Itoa(q.limit)}}
		if q.group.namespace != "" {
			v.Set("namespace", q.group.namespace)
		}
		p.Next = "?" + v.Encode()
	}
	for i := range kept {
		p.Held = append(p.Held, kept[i].row(now, hc.names))
	}
	return p
}
