package gate

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/internal/pgerr"
	"github.com/pgclaim/pgclaim/internal/qualify"
)

// explain returns err, when the server refused a privilege or found no
// table or schema, explained by the catalog (pgerr.ExplainAt): which
// privilege the role lacks on which of pgclaim's objects in schema and the
// GRANT that gives it, the same in every lc_messages. Any other error is
// returned as it is.
func explain(ctx context.Context, pool *pgxpool.Pool, schema *qualify.Schema, err error) error {
	if err == nil {
		return nil
	}
	return pgerr.ExplainAt(ctx, pool, schema.Name(), err)
}
