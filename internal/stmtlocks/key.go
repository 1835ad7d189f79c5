package stmtlocks

import (
	"database/sql/driver"
	"strconv"
	"strings"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
	"github.com/lockhooks/lockhooks/internal/lockset"
	"github.com/lockhooks/lockhooks/internal/pgdriver"
	"github.com/lockhooks/lockhooks/internal/sqlscan"
)

// KeyOf resolves a call's key from literals and bound arguments; false
// when an argument is an expression, or a bound value is not an integer.
func KeyOf(call sqlscan.AdvisoryCall, args []driver.NamedValue) (advisorykey.Key, bool) {
	k := advisorykey.Key{Shared: call.Func&sqlscan.FnShared != 0, Pair: call.NArgs == 2}
	if call.NArgs != 1 && call.NArgs != 2 {
		return k, false
	}
	var vals [2]int64
	for i := range call.NArgs {
		a := call.Args[i]
		switch a.Kind {
		case sqlscan.ArgLiteral:
			vals[i] = a.Value
		case sqlscan.ArgParam:
			v, ok := ArgInt(args, a.Param)
			if !ok {
				return k, false
			}
			vals[i] = v
		default:
			return k, false
		}
	}
	k.K1, k.K2 = vals[0], vals[1]
	return k, true
}

// ArgInt returns bound argument n (1-based) as an integer: an integer of
// any Go type that fits in an int64, a driver.Valuer's, or a string of
// decimal digits.
func ArgInt(args []driver.NamedValue, n int) (int64, bool) {
	for _, a := range args {
		if a.Ordinal != n {
			continue
		}
		v := a.Value
		if valuer, ok := v.(driver.Valuer); ok {
			var err error
			if v, err = valuer.Value(); err != nil {
				return 0, false
			}
		}
		if n, isInt, fits := lockset.IntegerValue(v); isInt {
			return n, fits
		}
		if x, ok := v.(string); ok {
			if n, err := strconv.ParseInt(x, 10, 64); err == nil {
				return n, true
			}
		}
		return 0, false
	}
	return 0, false
}

// EvalQuery is the query that has the server evaluate a call's key where
// its arguments are expressions (hashtext('name')): one column per
// argument, cast as the function takes it (bigint, or int4 for a pair),
// bound parameters kept as the statement's own ($n, so the statement's
// arguments bind them). ok is false for a call of neither one nor two
// arguments. A volatile expression may evaluate differently in the
// statement itself: the caller checks keys found this way against
// pg_locks after it.
func EvalQuery(call sqlscan.AdvisoryCall) (query string, ok bool) {
	if call.NArgs != 1 && call.NArgs != 2 {
		return "", false
	}
	typ := "bigint"
	if call.NArgs == 2 {
		typ = "int4"
	}
	exprs := make([]string, call.NArgs)
	for i := range call.NArgs {
		a := call.Args[i]
		switch a.Kind {
		case sqlscan.ArgLiteral:
			exprs[i] = strconv.FormatInt(a.Value, 10)
		case sqlscan.ArgParam:
			exprs[i] = "$" + strconv.Itoa(a.Param)
		default:
			exprs[i] = "(" + a.Text + ")"
		}
		exprs[i] += "::" + typ
	}
	return "SELECT " + strings.Join(exprs, ", "), true
}

// EvaluatedKey is call's key from the row EvalQuery's query returned
// (false for a row of another width).
func EvaluatedKey(call sqlscan.AdvisoryCall, row []driver.Value) (advisorykey.Key, bool) {
	k := advisorykey.Key{Shared: call.Func&sqlscan.FnShared != 0, Pair: call.NArgs == 2}
	if len(row) != call.NArgs || (call.NArgs != 1 && call.NArgs != 2) {
		return k, false
	}
	k.K1 = pgdriver.AsInt64(row[0])
	if k.Pair {
		k.K2 = pgdriver.AsInt64(row[1])
	}
	return k, true
}
