package gate

import "context"

// RetainNow runs a retention pass at once, b ticks per statement, as Once
// starts one when it is due.
func (g *Gate) RetainNow(ctx context.Context, b int32) (int64, error) {
	g.retainBatch = b
	return g.retainOnce(ctx)
}
