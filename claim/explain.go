package claim

import (
	"context"

	"github.com/pgclaim/pgclaim/internal/grants"
	"github.com/pgclaim/pgclaim/internal/pgerr"
)

// explain returns err, when the server refused a privilege or found no
// table, explained by the catalog (pgerr.ExplainAt): what the role lacks on
// the claimer's table (SELECT and UPDATE) and on pgclaim's fence (the
// function and its sequence), and the GRANT that gives it, in every
// lc_messages.
func (c *Claimer[K]) explain(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	t := c.c.t
	return pgerr.ExplainUsing(ctx, c.db, t.pgclaim.Name(), err, []string{"pgclaim_fence()", "pgclaim_fence_seq"},
		pgerr.Need{Kind: grants.Table, Schema: t.schema, Name: t.name, Privileges: "SELECT, UPDATE"})
}
