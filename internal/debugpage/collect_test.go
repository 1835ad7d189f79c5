package debugpage

import (
	"net/url"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
	"github.com/lockhooks/lockhooks/internal/callsite"
)

// testNames names ids as the root encodes them: a type tag, then the
// text of a string id ('s') or the decimal of an integer ('i', for the
// test; the root's are binary).
type testNames struct{}

func (testNames) Site(s *callsite.Stack) string { return "site" }
func (testNames) ID(cid string) string          { return strconv.Quote(cid[1:]) }
func (testNames) StringID(cid string) (string, bool) {
	if cid != "" && cid[0] == 's' {
		return cid[1:], true
	}
	return "", false
}
func (testNames) KeyName(k1 int64) (string, bool) {
	return "name " + strconv.FormatInt(k1, 10), k1%2 == 0
}

func TestNaturalCompare(t *testing.T) {
	ordered := []string{"", "a", "id-1", "id-01a", "id-2", "id-10", "id-10b", "id-100", "x"}
	for i, a := range ordered {
		for j, b := range ordered {
			want := cmpInt(int64(i), int64(j))
			if got := naturalCompare(a, b); got != want {
				t.Errorf("naturalCompare(%q, %q) = %d, want %d", a, b, got, want)
			}
		}
	}
	if naturalCompare("id-01", "id-1") != 0 {
		t.Error("01 and 1 are not the same number")
	}
}

func TestCursorRoundTrip(t *testing.T) {
	for _, p := range []heldPos{{}, {cid: "s id/7?&=", k1: -5, k2: 1 << 40, shared: true, conn: 1<<64 - 1}} {
		got, err := decodeHeldCursor(encodeHeldCursor(p))
		if err != nil || got != p {
			t.Errorf("%+v: decoded %+v, %v", p, got, err)
		}
	}
	for _, bad := range []string{"", "a.b", "!!.1.2.3.4", "YQ.1.2.3.x"} {
		if _, err := decodeHeldCursor(bad); err == nil {
			t.Errorf("cursor %q decoded", bad)
		}
	}
}

func TestParseQuery(t *testing.T) {
	q, isPage, err := ParseQuery(url.Values{"format": {"json"}}, 2)
	if q != nil || isPage || err != nil {
		t.Errorf("the summary: %v %v %v", q, isPage, err)
	}
	q, isPage, err = ParseQuery(url.Values{"kind": {"lockset"}, "namespace": {"n"}, "db": {"1"}, "limit": {"99999"}}, 2)
	if err != nil || !isPage || q.DB != 1 || q.limit != PageLimit || q.group != (heldGroupKey{"lockset", "n"}) {
		t.Errorf("a page: %+v %v %v", q, isPage, err)
	}
	for _, v := range []url.Values{{"kind": {"x"}, "db": {"2"}}, {"kind": {"x"}, "limit": {"0"}}, {"kind": {"x"}, "after": {"?"}}} {
		if _, isPage, err := ParseQuery(v, 2); err == nil || !isPage {
			t.Errorf("%v: no error", v)
		}
	}
}

// A group keeps the locks others wait for, then the oldest; a JSON page
// walks one group in key order, string ids by their numbers, and its
// cursor resumes it where it stopped.
func TestCollectorRowsAndPages(t *testing.T) {
	now := time.Now()
	var cands []Candidate
	for i := range 100 {
		cands = append(cands, Candidate{Kind: "lockset", Namespace: "inv", ID: "sid-" + strconv.Itoa(99-i), Conn: uint64(1 + i%3),
			Since: now.Add(-time.Duration(i) * time.Second), Count: 1, Waiters: boolInt(i == 50)})
	}
	cands = append(cands, Candidate{Kind: "advisory", Key: advisorykey.Key{K1: 4}, Advisory: true, Conn: 9, Count: 1})

	hc := NewCollector(nil, testNames{})
	for i := range cands {
		hc.Offer(&cands[i])
	}
	held, groups := hc.Rows(0, now)
	if hc.Total() != 101 || hc.Partial() || len(groups) != 2 || groups[0].Count != 100 || groups[0].Shown != RowsPerGroup || len(held) != RowsPerGroup+1 {
		t.Fatalf("%d offered, groups %+v, %d rows", hc.Total(), groups, len(held))
	}
	if held[0].Key != `"id-49"` || held[0].Waiters != 1 || held[1].Key != `"id-0"` || held[2].Key != `"id-1"` {
		t.Errorf("the first rows: %+v", held[:3])
	}
	if a := held[len(held)-1]; a.Key != "4" || a.Name != "name 4" || groups[1].Pages != "?db=0&format=json&kind=advisory" {
		t.Errorf("the advisory row %+v, group %+v", a, groups[1])
	}
	if h := groups[0].Holders; len(h) != 3 || h[0] != (GroupHolder{Conn: 1, Count: 34}) {
		t.Errorf("holders of the group: %+v", h)
	}

	var keys []string
	next := "?" + url.Values{"kind": {"lockset"}, "namespace": {"inv"}, "limit": {"30"}}.Encode()
	for pages := 0; next != ""; pages++ {
		u, err := url.Parse(next)
		if err != nil || pages > 4 {
			t.Fatalf("page %d: %q, %v", pages, next, err)
		}
		q, _, err := ParseQuery(u.Query(), 1)
		if err != nil {
			t.Fatal(err)
		}
		hc := NewCollector(q, testNames{})
		for i := range cands {
			hc.Offer(&cands[i])
		}
		p := hc.Page(now)
		if p.Count != 100 || len(p.Held) > 30 {
			t.Fatalf("page %d: count %d, %d rows", pages, p.Count, len(p.Held))
		}
		for _, h := range p.Held {
			keys = append(keys, h.Key)
		}
		next = p.Next
	}
	want := make([]string, 100)
	for i := range want {
		want[i] = strconv.Quote("id-" + strconv.Itoa(i))
	}
	if !slices.Equal(keys, want) {
		t.Errorf("the pages list %v", keys)
	}
}

// Offering a lock allocates nothing once its group is made: the page is
// fed every held lock under the lock tables' mutexes.
func TestOfferAllocatesNothing(t *testing.T) {
	hc := NewCollector(nil, testNames{})
	c := Candidate{Kind: "lockset", Namespace: "inv", ID: "sa", Conn: 1, Since: time.Now()}
	for range RowsPerGroup {
		hc.Offer(&c)
	}
	late := c
	late.Since = c.Since.Add(time.Second) // never among the top rows
	if n := testing.AllocsPerRun(1000, func() { hc.Offer(&late) }); n != 0 {
		t.Errorf("Offer allocates %v times", n)
	}
}
