package lockhooks

import "context"

// statement is what the hooks decided about one statement's text: the text
// to send and what the wrapper must do around it. It is a value, so
// classifying a statement allocates nothing.
type statement struct {
	text  string
	flags stmtFlags
}

// stmtFlags mark what a statement needs of the wrapper.
type stmtFlags uint8

// followRows reports whether the statement's rows must be wrapped.
func (st statement) followRows() bool { return st.flags != 0 }

// intercept is the one place where statement text is classified and
// rewritten, for Exec, Query and Prepare alike.
func (c *conn) intercept(ctx context.Context, query string) statement {
	return statement{text: query}
}
