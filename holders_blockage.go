package lockhooks

// A wait's blockage (holders.Blockage): the backends the server showed,
// identified as the model's holders where they are connections of
// lockhooks databases, of this process or another.

import (
	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/holding"
	"github.com/lockhooks/lockhooks/internal/pgblocking"
)

// identify returns the holder that backend s is, when it is a connection
// of a lockhooks database: of this process, as the model knows it (the
// lock among keys it holds, where and when it took it, or its
// transaction), or of another, as it published itself
// (pgblocking.Identify). ok is false for a backend nobody identified.
func identify(s holders.Blocker, keys []lockKey) (h holders.Holder, ok bool) {
	return pgblocking.Identify(s, func() (holders.Holder, bool) {
		seenBy, _ := s.SeenBy.(*connector)
		if oc := databases.connOf(s.PID, s.ApplicationName, s.Query, seenBy); oc != nil {
			return holding.Of(oc, keys), true
		}
		return holders.Holder{}, false
	}, describeAdvisoryKey)
}
