package holders

import (
	"encoding/json"
	"fmt"
)

// A Blocker is a Postgres backend that blocks a wait, as pg_blocking_pids
// and pg_stat_activity show it. The model names those that are
// connections of lockhooks databases as a [Holder], and shows the others
// as they are ([Blocker.String]); the debug page's JSON shows them all.
type Blocker struct {
	PID             int32   `json:"pid"`
	ApplicationName string  `json:"application_name"`
	State           string  `json:"state"`
	XactSeconds     float64 `json:"xact_age_seconds"`       // -1: no transaction
	Query           string  `json:"query"`                  // the statement text; never its arguments
	Depth           int     `json:"depth"`                  // 1: it blocks the waiter; 2: it blocks a backend of depth 1; …
	Waiting         bool    `json:"waiting"`                // it waits itself (queued ahead), so it is not the holder at the root
	WaitSeconds     float64 `json:"wait_seconds,omitempty"` // how long it has waited, when Waiting

	// SeenBy is the database whose side connection read it (the
	// adapter's own value, compared only): its PID is a backend of that
	// server.
	SeenBy any `json:"-"`
	// StateSeconds is how long its state has been State
	// (pg_stat_activity's state_change; 0 or -1: unknown).
	StateSeconds float64 `json:"-"`
}

// String names a backend nobody identified, for a slow-wait line or an
// error.
func (b Blocker) String() string {
	s := fmt.Sprintf("backend pid %d", b.PID)
	if b.ApplicationName != "" {
		s += fmt.Sprintf(" (%q)", b.ApplicationName)
	}
	s += ", " + b.State
	if b.XactSeconds >= 0 {
		s += fmt.Sprintf(", transaction open %.1fs", b.XactSeconds)
	}
	switch {
	case b.Waiting:
		if b.WaitSeconds > 0 {
			s += fmt.Sprintf(", waiting %.1fs", b.WaitSeconds)
		}
		if b.Query != "" {
			s += fmt.Sprintf(" in %.120q", b.Query)
		}
	case b.Query != "":
		s += fmt.Sprintf(", last statement %.120q", b.Query)
	}
	return s
}

// Aged is b d seconds later.
func (b Blocker) Aged(d float64) Blocker {
	if b.XactSeconds >= 0 {
		b.XactSeconds = Round3(b.XactSeconds + d)
	}
	if b.WaitSeconds > 0 {
		b.WaitSeconds = Round3(b.WaitSeconds + d)
	}
	return b
}

// Round3 rounds f to three decimals, as the model's ages and waits are
// shown.
func Round3(f float64) float64 { return float64(int64(f*1000+0.5)) / 1000 }

// MarshalJSON leaves out the transaction age of a backend that is in no
// transaction (idle), instead of writing -1.
func (b Blocker) MarshalJSON() ([]byte, error) {
	type plain Blocker // without this method
	var x struct {
		plain
		XactSeconds *float64 `json:"xact_age_seconds,omitempty"`
	}
	x.plain = plain(b)
	if b.XactSeconds >= 0 {
		x.XactSeconds = &b.XactSeconds
	}
	return json.Marshal(x)
}

// UnmarshalJSON reads what MarshalJSON writes: an absent transaction age
// is -1.
func (b *Blocker) UnmarshalJSON(data []byte) error {
	type plain Blocker
	var x struct {
		plain
		XactSeconds *float64 `json:"xact_age_seconds"`
	}
	if err := json.Unmarshal(data, &x); err != nil {
		return err
	}
	*b = Blocker(x.plain)
	b.XactSeconds = -1
	if x.XactSeconds != nil {
		b.XactSeconds = *x.XactSeconds
	}
	return nil
}
