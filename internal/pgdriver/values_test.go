package pgdriver

import (
	"database/sql/driver"
	"testing"
)

func TestValues(t *testing.T) {
	for _, c := range []struct {
		v    driver.Value
		s    string
		n    int64
		f    float64
		bool bool
	}{
		{int64(42), "42", 42, 42, false},
		{[]byte("42"), "42", 42, 42, false},
		{"7", "7", 7, 7, false},
		{1.5, "1.5", 0, 1.5, false},
		{[]byte("2.25"), "2.25", 0, 2.25, false},
		{true, "true", 0, 0, true},
		{[]byte("t"), "t", 0, 0, true},
		{"t", "t", 0, 0, true},
		{nil, "", 0, 0, false},
	} {
		if s, n, f, b := AsString(c.v), AsInt64(c.v), AsFloat64(c.v), AsBool(c.v); s != c.s || n != c.n || f != c.f || b != c.bool {
			t.Errorf("%#v: %q %d %v %v, want %q %d %v %v", c.v, s, n, f, b, c.s, c.n, c.f, c.bool)
		}
	}
}
