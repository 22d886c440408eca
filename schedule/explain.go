package schedule

import (
	"context"

	"github.com/pgclaim/pgclaim/internal/pgerr"
)

// explain returns err, when the server refused a privilege or found no
// table or schema, explained by the catalog (pgerr.ExplainAt): which
// privilege the role lacks on which of pgclaim's objects and the GRANT
// that gives it, or that pgclaim's tables are missing; the same in every
// lc_messages. Any other error is returned as it is.
func (s *Scheduler) explain(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	return pgerr.ExplainAt(ctx, s.pool, s.schema.Name(), err)
}
