package holders

import "time"

// Event is one thing that happened to a database's locks (a lost lock, a
// rerouted or refused unlock, a deadlock, a slow wait, ...), as the model
// keeps the last of them and /debug/locks shows them.
type Event struct {
	Time    time.Time `json:"time"`
	Kind    string    `json:"kind"`
	Message string    `json:"message"`
}

// Truncate shortens s to at most n bytes, on a rune boundary, and marks
// the cut with "…": how the model's consumers bound statement text, names
// and messages.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !runeStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// runeStart reports whether b starts a UTF-8 sequence.
func runeStart(b byte) bool { return b&0xC0 != 0x80 }
