package claim

// All the SQL the package generates is built here, each statement by one
// builder that numbers a placeholder as it appends its argument.

import (
	"fmt"
	"strings"
)

// recheck returns cond written so that the planner cannot use it to choose
// how to find rows: in a WHERE clause, "(cond) IS TRUE" keeps exactly the
// rows cond keeps (false and NULL both drop a row), but it is neither an
// index condition nor a proof of a partial index's predicate.
//
// Every statement here over rows known in advance — by key, or by the keys
// a selection has just locked — finds them through the key's unique index,
// and checks state, token and times with recheck. Written plainly, those
// checks invite the planner to find the rows through an index on the state
// or on a time instead, at a cost it estimates from the table's statistics;
// and a burst of claims makes the statistics wrong exactly there (taken
// while every row was PAUSED, they say that no row is PROCESSING). Such a
// plan reads every row in the state, or does so once per row to touch: a
// sweep or a batch claim of 1,000 rows after a burst of 100,000 took 16 s.
// Found by key, a statement reads the rows it touches and no others.
func recheck(cond string) string { return "(" + cond + ") IS TRUE" }

// spreadPages is about how many pages of the table a Config.Spread claim
// samples for its pivot: with 3 the sample finds no page about one time in
// twenty (e^-3), and reads a few hundred narrow rows.
const spreadPages = 3

// build builds the claimer's statements.
func (c *core) build(cfg Config) {
	t := c.t
	// due is the condition that a row may be claimed now, on the row named
	// by prefix.
	due := func(prefix string) string {
		if t.retryAt == "" {
			return ""
		}
		return fmt.Sprintf(" AND (%[1]s%[2]s IS NULL OR %[1]s%[2]s <= statement_timestamp())", prefix, t.retryAt)
	}

	var q builder
	key, from := q.arg(inKey), q.arg(c.from)
	set := c.claimSet(&q)
	q.add("UPDATE ", t.qname, " AS pgclaim_t SET ", set, " WHERE pgclaim_t.", t.key, " = ", key,
		" AND ", recheck("pgclaim_t."+t.state+" = "+from+due("pgclaim_t.")), " RETURNING ", c.returning())
	c.sqlClaim = q.done()

	order := t.key
	if strings.TrimSpace(cfg.Order) != "" {
		order = cfg.Order
	}
	where := ""
	if strings.TrimSpace(cfg.Where) != "" {
		where = " AND (" + cfg.Where + ")"
	}
	// Config.Where's own $1..$k come first, then the limit: claimBatch
	// binds its where values, then n.
	q = builder{}
	for i := range c.whereParams {
		q.arg(in(i))
	}
	// The state is written into the text, not bound: so the plan the
	// server caches for the statement (a generic plan, after a few
	// executions) can use a partial index "WHERE state = 'PAUSED'", as a
	// plan made for the value would. A parameter cannot prove an index's
	// predicate, and a generic plan with one walks past every row already
	// claimed or finished on each batch. The states are configuration,
	// quoted as literals; the literal takes the column's type (an enum, a
	// domain) as a parameter would.
	from = quoteLiteral(c.from)
	limit := q.arg(in(c.whereParams))
	set = c.claimSet(&q)
	// The selection locks the rows; the update finds them by key (see
	// recheck). The state is re-checked on the locked row.
	claimable := t.state + " = " + from + due("") + where
	if cfg.Spread {
		// A random claimable row from about spreadPages sampled pages is
		// the pivot. The selections are read in turn, each only as far
		// as the outer LIMIT needs (a WITH query's rows are computed as
		// they are fetched, and its FOR UPDATE locks only those): from
		// the pivot on, then before it; from the first row when there is
		// no pivot (a one-time filter: no scan otherwise).
		pages := fmt.Sprintf("(SELECT least(100, %d.0 / greatest(pg_relation_size(%s::regclass) / current_setting('block_size')::bigint, 1)))",
			100*spreadPages, quoteLiteral(t.qname))
		sel := func(cond string) string {
			return "  SELECT " + t.key + " FROM " + t.qname + " WHERE " + claimable + cond +
				" ORDER BY " + t.key + " LIMIT " + limit + " FOR UPDATE SKIP LOCKED\n"
		}
		q.add("WITH pgclaim_p AS MATERIALIZED (\n",
			"  SELECT ", t.key, " AS pgclaim_k FROM ", t.qname, " TABLESAMPLE SYSTEM (", pages, ") WHERE ", claimable, " ORDER BY random() LIMIT 1\n",
			"), pgclaim_a AS (\n", sel(" AND "+t.key+" >= (SELECT pgclaim_k FROM pgclaim_p)"),
			"), pgclaim_b AS (\n", sel(" AND "+t.key+" < (SELECT pgclaim_k FROM pgclaim_p)"),
			"), pgclaim_h AS (\n", sel(" AND NOT EXISTS (SELECT 1 FROM pgclaim_p)"),
			"), pgclaim_c AS (\n",
			"  SELECT ", t.key, " FROM (SELECT ", t.key, " FROM pgclaim_a UNION ALL SELECT ", t.key, " FROM pgclaim_b UNION ALL SELECT ", t.key, " FROM pgclaim_h) pgclaim_s LIMIT ", limit, "\n",
			")\n")
	} else {
		q.add("WITH pgclaim_c AS (\n",
			"  SELECT ", t.key, " FROM ", t.qname, " WHERE ", claimable,
			" ORDER BY ", order, " LIMIT ", limit, " FOR UPDATE SKIP LOCKED\n",
			")\n")
	}
	q.add(
		"UPDATE ", t.qname, " AS pgclaim_t SET ", set, "\n",
		"WHERE pgclaim_t.", t.key, " = ANY(ARRAY(SELECT ", t.key, " FROM pgclaim_c)) AND ", recheck("pgclaim_t."+t.state+" = "+from), "\n",
		"RETURNING pgclaim_t.", t.key, ", ", c.returning())
	c.sqlBatch = q.done()

	// Whether rows within Config.Where are held in To (a Worker's Drain
	// with Recover waits for them).
	q = builder{}
	for i := range c.whereParams {
		q.arg(in(i))
	}
	q.add("SELECT EXISTS (SELECT 1 FROM ", t.qname, " WHERE ", t.state, " = ", quoteLiteral(c.to), where, ")")
	c.sqlOpen = q.done()

	if t.fence == "" {
		return
	}
	// fenced adds to q the condition on a claim's row: found by key, in
	// To, with the claim's token.
	fenced := func(q *builder) string {
		key, to, fence := q.arg(inKey), q.arg(c.to), q.arg(inFence)
		return t.key + " = " + key + " AND " + recheck(t.state+" = "+to+" AND "+t.fence+" = "+fence)
	}
	for reason := range 2 {
		for retry := range 2 {
			if (reason == 1 && t.reason == "") || (retry == 1 && t.retryAt == "") {
				continue
			}
			var q builder
			set := t.state + " = " + q.arg(inValue)
			cond := fenced(&q)
			if reason == 1 {
				set += ", " + t.reason + " = " + q.arg(inReason)
			}
			if retry == 1 {
				set += ", " + t.retryAt + " = statement_timestamp() + (" + q.arg(inRetryIn) + "::bigint * interval '1 microsecond')"
			}
			q.add("UPDATE ", t.qname, " SET ", set, " WHERE ", cond)
			c.sqlFinish[reason][retry] = q.done()
		}
	}

	q = builder{}
	release := t.state + " = " + q.arg(c.from)
	if t.attempts != "" {
		release += fmt.Sprintf(", %[1]s = GREATEST(COALESCE(%[1]s, 1) - 1, 0)", t.attempts)
	}
	q.add("UPDATE ", t.qname, " SET ", release, " WHERE ", fenced(&q))
	c.sqlRelease = q.done()

	q = builder{}
	byKeys, isClaim, pos := c.claimsCond(&q)
	state, to := q.arg(inValue), q.arg(c.to)
	q.add("UPDATE ", t.qname, " AS pgclaim_t SET ", t.state, " = ", state, "\n",
		"WHERE ", byKeys, " AND ", recheck("pgclaim_t."+t.state+" = "+to+" AND "+isClaim), "\n",
		"RETURNING ", pos)
	c.sqlFinishBatch = q.done()

	if t.leaseUntil == "" {
		return
	}
	q = builder{}
	d := q.arg(inValue)
	q.add("UPDATE ", t.qname, " SET ", t.leaseUntil, " = statement_timestamp() + (", d, "::bigint * interval '1 microsecond')",
		" WHERE ", fenced(&q), " RETURNING ", t.leaseUntil)
	c.sqlExtend = q.done()

	// Heartbeat: extend many claims at once, skipping rows locked by
	// another transaction (typically the worker's own work transaction
	// touching the row) instead of waiting for it.
	q = builder{}
	byKeys, isClaim, pos = c.claimsCond(&q)
	still := recheck("pgclaim_t." + t.state + " = " + q.arg(c.to) + " AND " + isClaim)
	d = q.arg(inValue)
	q.add("WITH pgclaim_l AS (\n",
		"  SELECT pgclaim_t.", t.key, " FROM ", t.qname, " AS pgclaim_t\n",
		"  WHERE ", byKeys, " AND ", still, "\n",
		"  FOR UPDATE OF pgclaim_t SKIP LOCKED\n",
		")\n",
		"UPDATE ", t.qname, " AS pgclaim_t SET ", t.leaseUntil, " = statement_timestamp() + (", d, "::bigint * interval '1 microsecond')\n",
		"WHERE pgclaim_t.", t.key, " = ANY(ARRAY(SELECT ", t.key, " FROM pgclaim_l)) AND ", still, "\n",
		"RETURNING ", pos)
	c.sqlHeartbeat = q.done()

	q = builder{}
	byKeys, isClaim, pos = c.claimsCond(&q)
	still = recheck("pgclaim_t." + t.state + " = " + q.arg(c.to) + " AND " + isClaim)
	q.add("SELECT ", pos, " FROM ", t.qname, " AS pgclaim_t WHERE ", byKeys, " AND ", still)
	c.sqlHeld = q.done()
}

// claimSet adds to q the SET list of a claim and its arguments. Every
// claimed row gets its own token from pgclaim_fence() (see the migration
// 00005_pgclaim_fence_timeline.sql): it is volatile, so it is evaluated
// once per row. That also lets statements over many claims (FinishBatch,
// the heartbeat) handle a whole batch in one statement: see matchClaims.
func (c *core) claimSet(q *builder) string {
	t := c.t
	set := t.state + " = " + q.arg(c.to) + ", " + t.claimedAt + " = statement_timestamp()"
	if t.claimedBy != "" {
		set += ", " + t.claimedBy + " = " + q.arg(c.holder)
	}
	if t.fence != "" {
		set += ", " + t.fence + " = " + t.pgclaim.Object("pgclaim_fence()")
	}
	if t.attempts != "" {
		set += fmt.Sprintf(", %s = COALESCE(pgclaim_t.%s, 0) + 1", t.attempts, t.attempts)
	}
	if t.leaseUntil != "" {
		if c.lease > 0 {
			set += ", " + t.leaseUntil + " = statement_timestamp() + (" + q.arg(micros(c.lease)) + "::bigint * interval '1 microsecond')"
		} else {
			set += ", " + t.leaseUntil + " = NULL"
		}
	}
	return set
}

// returning is the RETURNING list shared by Claim and ClaimBatch (after the
// key): claimed_at, token, attempts.
func (c *core) returning() string {
	t := c.t
	s := "pgclaim_t." + t.claimedAt
	if t.fence != "" {
		s += ", pgclaim_t." + t.fence
	} else {
		s += ", 0::bigint"
	}
	if t.attempts != "" {
		s += ", pgclaim_t." + t.attempts + "::bigint"
	} else {
		s += ", 0::bigint"
	}
	return s
}

// claimsCond adds to q the claims of a statement over many claims, keys
// (inKey, []K) and tokens (inFence, []int64, sorted, none twice; see
// matchClaims), as $1 and $2 of a fresh q, and returns its conditions on
// the table aliased pgclaim_t:
//
//	byKeys:  key = ANY($1)
//	isClaim: fence = $2[pos] AND key = $1[pos]
//	pos:     width_bucket(fence, $2)
//
// width_bucket(f, $2) is a binary search in the sorted tokens: the number of
// tokens less than or equal to f. As no token is there twice, when f is the
// j-th token pos is j, and when f is not among them $2[pos] is another token
// (or NULL). So isClaim holds exactly when some j has $2[j] = fence and
// $1[j] = key: it is the pairwise check "(key, token) is one of the
// claims", at O(log n) per row, and pos names the claim, which the
// statements return. byKeys is implied by isClaim; it is there for the
// planner, as the index condition that finds the rows by key (see recheck).
// A statement over n claims thus reads at most n rows, whatever the
// statistics say.
//
// The pairwise check is also written as a join of the table to
// unnest($1, $2), but then the plan depends on the planner's estimate of
// how many rows are in the To state, and statistics from before a burst of
// claims put it at one: FinishBatch of 1,000 claims on a 200,000-row table
// scanned the table and compared every PROCESSING row with every claim, in
// 0.9 to 1.9 s instead of 5 ms.
//
// With a token twice in $2 (never sent: see matchClaims), pos would name the
// last claim with that token, and the check would accept fewer rows than the
// pairwise check, never more.
func (c *core) claimsCond(q *builder) (byKeys, isClaim, pos string) {
	t := c.t
	keys, fences := q.arg(inKey), q.arg(inFence)
	// keysAs is keys typed as an array of the key column's type: COALESCE
	// takes the type of its second argument, which is never evaluated.
	// This works whether keys is a bound parameter or a literal (simple
	// protocol).
	keysAs := "COALESCE(" + keys + ", ARRAY(SELECT " + t.key + " FROM " + t.qname + " LIMIT 0))"
	pos = "width_bucket(pgclaim_t." + t.fence + ", " + fences + "::bigint[])"
	byKeys = "pgclaim_t." + t.key + " = ANY(" + keysAs + ")"
	isClaim = "pgclaim_t." + t.fence + " = (" + fences + "::bigint[])[" + pos + "] AND pgclaim_t." + t.key + " = (" + keysAs + ")[" + pos + "]"
	return byKeys, isClaim, pos
}

// build builds the sweeper's statement. SweeperConfig.Where's own $1..$k
// come first, bound to SweeperConfig.Args (NewSweeper checked that there
// are k).
func (s *Sweeper[K]) build() {
	t := s.c.c.t
	cfg := s.cfg
	var q builder
	for _, a := range cfg.Args {
		q.arg(a)
	}
	// Written into the text for the plan's sake, as the batch claim's
	// state is (see core.build).
	processing := quoteLiteral(s.c.c.to)
	limit := q.arg(s.batch)
	var staleAfter string
	if cfg.StaleAfter > 0 {
		staleAfter = q.arg(micros(cfg.StaleAfter))
	}
	// stale is the staleness condition on the row named by prefix.
	stale := func(prefix string) string {
		old := fmt.Sprintf("%s%s < statement_timestamp() - (%s::bigint * interval '1 microsecond')", prefix, t.claimedAt, staleAfter)
		switch {
		case t.leaseUntil == "":
			return old
		case staleAfter == "":
			return fmt.Sprintf("%s%s < statement_timestamp()", prefix, t.leaseUntil)
		default:
			return fmt.Sprintf("(%[1]s%[2]s < statement_timestamp() OR (%[1]s%[2]s IS NULL AND %[3]s))", prefix, t.leaseUntil, old)
		}
	}
	newState := q.arg(cfg.Failed)
	retryAt := ""
	if p := cfg.Retry; p.State != "" {
		failed := newState
		retry := q.arg(p.State)
		// attemptsLeft holds for a row that goes to Retry.State: attempts
		// remain, and (with FailAfter) it was not claimed too long ago.
		attemptsLeft := "COALESCE(pgclaim_t." + t.attempts + ", 0) < " + q.arg(p.MaxAttempts)
		if cfg.FailAfter > 0 {
			attemptsLeft += " AND NOT ((pgclaim_t." + t.claimedAt + " < statement_timestamp() - (" +
				q.arg(micros(cfg.FailAfter)) + "::bigint * interval '1 microsecond')) IS TRUE)"
		}
		if p.Backoff > 0 {
			// wait is RetryPolicy.wait of the row's attempts, in
			// microseconds: Backoff doubled attempts-1 times (at most
			// maxDoublings), capped at MaxBackoff.
			wait := q.arg(micros(p.Backoff)) + "::bigint"
			if p.doubles() {
				wait = "LEAST(" + wait + " << LEAST(GREATEST(COALESCE(pgclaim_t." + t.attempts + ", 0) - 1, 0), " +
					q.arg(p.maxDoublings()) + "::int)::int, " + q.arg(micros(p.MaxBackoff)) + "::bigint)"
			}
			retryAt = "CASE WHEN " + attemptsLeft + " THEN statement_timestamp() + (" + wait +
				" * interval '1 microsecond') ELSE pgclaim_t." + t.retryAt + " END"
		}
		// The ELSE branch is never taken: it gives the CASE the state
		// column's type (which may be an enum), so that the two states,
		// parameters or literals, are read as values of that type.
		newState = "CASE WHEN " + attemptsLeft + " THEN " + retry + " WHEN true THEN " + failed + " ELSE pgclaim_t." + t.state + " END"
	}
	where := ""
	if strings.TrimSpace(cfg.Where) != "" {
		where = " AND (" + cfg.Where + ")"
	}
	why := s.reasonExpr(&q, staleAfter)
	set := t.state + " = " + newState
	if retryAt != "" {
		set += ", " + t.retryAt + " = " + retryAt
	}
	if t.reason != "" {
		set += ", " + t.reason + " = " + why
	}
	ret := "pgclaim_t." + t.key + ", pgclaim_t." + t.state + "::text"
	for _, col := range []struct{ name, zero string }{
		{t.fence, "0::bigint"}, {t.claimedBy, "''::text"}, {t.claimedAt, ""}, {t.attempts, "0::bigint"},
	} {
		switch {
		case col.name == "":
			ret += ", " + col.zero
		case col.name == t.attempts:
			ret += ", pgclaim_t." + col.name + "::bigint"
		case col.name == t.claimedBy:
			ret += ", COALESCE(pgclaim_t." + col.name + "::text, '')"
		default:
			ret += ", pgclaim_t." + col.name
		}
	}
	if t.reason != "" {
		ret += ", pgclaim_t." + t.reason
	} else {
		ret += ", " + why
	}
	// The selection locks at most a batch of stale rows; the update finds
	// them by key and re-checks state and staleness on each locked row, so
	// a row finished since the selection's snapshot is left alone. The
	// re-check is written with recheck, so that the planner cannot trade
	// the key index for an index on the state or the times, whose
	// statistics are typically stale by the time rows go stale.
	q.add("WITH pgclaim_c AS (\n",
		"  SELECT ", t.key, " FROM ", t.qname, "\n",
		"  WHERE ", t.state, " = ", processing, " AND ", stale(""), where, "\n",
		"  ORDER BY ", t.claimedAt, "\n",
		"  LIMIT ", limit, "\n",
		"  FOR UPDATE SKIP LOCKED\n",
		")\n",
		"UPDATE ", t.qname, " AS pgclaim_t SET ", set, "\n",
		"WHERE pgclaim_t.", t.key, " = ANY(ARRAY(SELECT ", t.key, " FROM pgclaim_c)) AND ",
		recheck("pgclaim_t."+t.state+" = "+processing+" AND "+stale("pgclaim_t.")), "\n",
		"RETURNING ", ret)
	s.sql = q.done()
}

// reasonExpr returns the SQL text expression saying why a row of
// pgclaim_t is swept, from its values before the sweep, adding its
// arguments to q: staleAfter is the placeholder of StaleAfter in
// microseconds ("" when not set).
func (s *Sweeper[K]) reasonExpr(q *builder, staleAfter string) string {
	t := s.c.c.t
	ts := func(col string) string {
		return fmt.Sprintf(`to_char(pgclaim_t.%s AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')`, col)
	}
	var claimedLong string
	if staleAfter != "" {
		claimedLong = "'claimed at ' || " + ts(t.claimedAt) + " || ', more than ' || " + q.arg(s.cfg.StaleAfter.String()) + " || ' ago'"
	}
	failClause := func() string {
		failAfter := q.arg(micros(s.cfg.FailAfter))
		return " || CASE WHEN pgclaim_t." + t.claimedAt + " < statement_timestamp() - (" + failAfter +
			"::bigint * interval '1 microsecond') THEN ', claimed more than ' || " + q.arg(s.cfg.FailAfter.String()) + " || ' ago' ELSE '' END"
	}
	// With FailAfter equal to StaleAfter, a row stale by its claim's age
	// already reads "claimed at T, more than D ago": the FailAfter clause
	// would repeat it, so only a row stale by its lease gets it.
	sameAge := staleAfter != "" && s.cfg.FailAfter == s.cfg.StaleAfter
	var what string
	switch {
	case t.leaseUntil == "":
		what = claimedLong
		if s.cfg.FailAfter > 0 && !sameAge {
			what += failClause()
		}
	case staleAfter == "":
		what = "'lease expired at ' || " + ts(t.leaseUntil)
		if s.cfg.FailAfter > 0 {
			what += failClause()
		}
	case sameAge:
		what = "CASE WHEN pgclaim_t." + t.leaseUntil + " IS NOT NULL THEN 'lease expired at ' || " + ts(t.leaseUntil) + failClause() + " ELSE " + claimedLong + " END"
	default:
		what = "CASE WHEN pgclaim_t." + t.leaseUntil + " IS NOT NULL THEN 'lease expired at ' || " + ts(t.leaseUntil) + " ELSE " + claimedLong + " END"
		if s.cfg.FailAfter > 0 {
			what += failClause()
		}
	}
	var who []string
	if t.claimedBy != "" {
		who = append(who, fmt.Sprintf("COALESCE('claim by ' || pgclaim_t.%s, 'claim')", t.claimedBy))
	} else {
		who = append(who, "'claim'")
	}
	if t.fence != "" {
		who = append(who, fmt.Sprintf("COALESCE(', fence ' || pgclaim_t.%s, '')", t.fence))
	}
	if t.attempts != "" {
		who = append(who, fmt.Sprintf("COALESCE(', attempt ' || pgclaim_t.%s, '')", t.attempts))
	}
	return "('claim: swept: ' || " + what + " || ' (' || " + strings.Join(who, " || ") + " || ')')"
}
