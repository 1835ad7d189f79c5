package pgdriver

import (
	"database/sql/driver"
	"fmt"
	"strconv"
)

// The values of lockhooks' own reads, as the drivers return them: pgx's
// stdlib gives int64, float64, bool and string; lib/pq and the simple
// protocol may give text ([]byte); modernc gives int64 and string. Each
// converter takes any of them and answers the zero value for what it
// cannot read.

// AsString converts the text values drivers return (nil: "").
func AsString(v driver.Value) string {
	switch x := v.(type) {
	case string:
		return x
	case []byte:
		return string(x)
	case nil:
		return ""
	}
	return fmt.Sprint(v)
}

// AsInt64 converts the integer values drivers return.
func AsInt64(v driver.Value) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case int32:
		return int64(x)
	case int:
		return int64(x)
	case []byte:
		n, _ := strconv.ParseInt(string(x), 10, 64)
		return n
	case string:
		n, _ := strconv.ParseInt(x, 10, 64)
		return n
	}
	return 0
}

// AsFloat64 converts the float values drivers return.
func AsFloat64(v driver.Value) float64 {
	switch x := v.(type) {
	case float64:
		return x
	case float32:
		return float64(x)
	case int64:
		return float64(x)
	case []byte:
		f, _ := strconv.ParseFloat(string(x), 64)
		return f
	case string:
		f, _ := strconv.ParseFloat(x, 64)
		return f
	}
	return 0
}

// AsBool converts the boolean values drivers return: a bool; text
// ([]byte) whose first byte is 't' or '1'; the strings "t" and "true".
func AsBool(v driver.Value) bool {
	switch x := v.(type) {
	case bool:
		return x
	case []byte:
		return len(x) > 0 && (x[0] == 't' || x[0] == '1')
	case string:
		return x == "t" || x == "true"
	}
	return false
}
