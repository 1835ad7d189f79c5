package advisorykey

import (
	"strconv"
	"strings"
)

// Token writes k as an identity names the key a holder holds (in
// application_name and in the annotation of lockhooks' own statements):
// 42, 1/2, 42-shared.
func (k Key) Token() string {
	var buf [48]byte
	return string(k.AppendToken(buf[:0]))
}

// AppendToken appends k's [Key.Token] to b.
func (k Key) AppendToken(b []byte) []byte {
	b = strconv.AppendInt(b, k.K1, 10)
	if k.Pair {
		b = strconv.AppendInt(append(b, '/'), k.K2, 10)
	}
	if k.Shared {
		b = append(b, "-shared"...)
	}
	return b
}

// ParseToken reads a key as [Key.Token] writes it: 42, 1/2, 42-shared.
func ParseToken(s string) (Key, bool) {
	var k Key
	s, k.Shared = strings.CutSuffix(s, "-shared")
	a, b, pair := strings.Cut(s, "/")
	k1, err := strconv.ParseInt(a, 10, 64)
	if err != nil {
		return Key{}, false
	}
	k.K1 = k1
	if pair {
		k2, err := strconv.ParseInt(b, 10, 64)
		if err != nil {
			return Key{}, false
		}
		k.Pair, k.K2 = true, k2
	}
	return k, true
}
