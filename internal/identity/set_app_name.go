package identity

import "strconv"

// SetAppName is the SQL expression that sets application_name to value
// (local: for the transaction only), unless the user set one: a value that
// is empty or lockhooks' own (it begins with [AppNamePrefix]) is replaced,
// any other is kept. onPID, if not 0, sets it only on that backend. value
// is written as it is: it must be an identity's [Holder.AppName], whose
// characters need no quoting.
func SetAppName(value string, local bool, onPID int32) string {
	var buf [512]byte
	b := append(buf[:0], "set_config('application_name', CASE WHEN "...)
	if onPID != 0 {
		b = strconv.AppendInt(append(b, "pg_backend_pid() = "...), int64(onPID), 10)
		b = append(b, " AND "...)
	}
	b = append(b, "(current_setting('application_name') = '' OR current_setting('application_name') LIKE '"+AppNamePrefix+"%') THEN '"...)
	b = append(b, value...)
	b = append(b, "' ELSE current_setting('application_name') END, "...)
	b = strconv.AppendBool(b, local)
	return string(append(b, ')'))
}
