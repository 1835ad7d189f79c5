package advisorykey

import "testing"

// A key's token reads back as the same key, and text that is no token is
// refused.
func TestTokenRoundTrip(t *testing.T) {
	for _, c := range []struct {
		k    Key
		want string
	}{
		{Key{K1: 42}, "42"},
		{Key{K1: -7, Shared: true}, "-7-shared"},
		{Key{Pair: true, K1: 1, K2: 2}, "1/2"},
		{Key{Pair: true, K1: -1, K2: -2, Shared: true}, "-1/-2-shared"},
	} {
		if got := c.k.Token(); got != c.want {
			t.Errorf("%+v.Token() = %q, want %q", c.k, got, c.want)
		}
		if back, ok := ParseToken(c.want); !ok || back != c.k {
			t.Errorf("ParseToken(%q) = %+v, %v; want %+v", c.want, back, ok, c.k)
		}
	}
	for _, s := range []string{"", "x", "1/", "/2", "1/2/3", "1-exclusive"} {
		if k, ok := ParseToken(s); ok {
			t.Errorf("ParseToken(%q) = %+v, want refused", s, k)
		}
	}
}
