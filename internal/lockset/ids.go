package lockset

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Type tags of canonical ids; their order is the order between types.
const (
	TagInt    = 'i'
	TagString = 's'
	TagUUID   = 'u'
)

// CanonicalIDs encodes ids so that byte order is the documented lock order,
// sorts them and drops duplicates. An id is an integer of any Go integer
// type (fitting an int64), a string, a [16]byte UUID or a fmt.Stringer.
func CanonicalIDs(ids []any) ([]string, error) {
	if len(ids) == 0 {
		return nil, errors.New("lockhooks: Lock needs at least one id")
	}
	keys := make([]string, 0, len(ids))
	for _, id := range ids {
		var b []byte
		if n, isInt, fits := IntegerValue(id); isInt {
			if !fits {
				return nil, fmt.Errorf("lockhooks: id %d does not fit an int64", id)
			}
			keys = append(keys, IntID(n))
			continue
		}
		switch v := id.(type) {
		case string:
			b = append([]byte{TagString}, v...)
		case [16]byte:
			b = append([]byte{TagUUID}, v[:]...)
		case fmt.Stringer:
			b = append([]byte{TagString}, v.String()...)
		default:
			return nil, fmt.Errorf("lockhooks: cannot lock an id of type %T; use an integer, a string, a [16]byte UUID or a fmt.Stringer", id)
		}
		keys = append(keys, string(b))
	}
	slices.Sort(keys)
	return slices.Compact(keys), nil
}

// IntID is the canonical id of integer n: byte order is numeric order.
func IntID(n int64) string {
	b := make([]byte, 9)
	b[0] = TagInt
	binary.BigEndian.PutUint64(b[1:], uint64(n)^(1<<63))
	return string(b)
}

// ValidID reports whether s is an id as CanonicalIDs encodes it.
func ValidID(s string) bool {
	if s == "" {
		return false
	}
	switch s[0] {
	case TagInt:
		return len(s) == 9
	case TagUUID:
		return len(s) == 17
	case TagString:
		return true
	}
	return false
}

// DescribeID turns a canonical id back into text for messages: the
// integer, the UUID's hex digits, or the quoted string.
func DescribeID(id string) string {
	switch id[0] {
	case TagInt:
		return strconv.FormatInt(int64(binary.BigEndian.Uint64([]byte(id[1:]))^(1<<63)), 10)
	case TagUUID:
		return fmt.Sprintf("%x", id[1:])
	}
	return strconv.Quote(id[1:])
}

// DescribeIDs lists canonical ids as text, separated by commas.
func DescribeIDs(ids []string) string {
	parts := make([]string, len(ids))
	for i, k := range ids {
		parts[i] = DescribeID(k)
	}
	return strings.Join(parts, ", ")
}

// IntegerValue converts a value of any of Go's integer types to int64:
// isInt reports whether v has an integer type, fits whether its value
// fits an int64.
func IntegerValue(v any) (n int64, isInt, fits bool) {
	switch x := v.(type) {
	case int64:
		return x, true, true
	case int:
		return int64(x), true, true
	case int32:
		return int64(x), true, true
	case int16:
		return int64(x), true, true
	case int8:
		return int64(x), true, true
	case uint32:
		return int64(x), true, true
	case uint16:
		return int64(x), true, true
	case uint8:
		return int64(x), true, true
	case uint:
		return int64(x), true, uint64(x) <= 1<<63-1
	case uint64:
		return int64(x), true, x <= 1<<63-1
	}
	return 0, false, false
}
