package shedlock_test

import (
	"context"
	"testing"
	"time"

	"github.com/pgclaim/pgclaim/harness/shedlock"
	"github.com/pgclaim/pgclaim/pgtest"
	_ "github.com/pgclaim/pgclaim/pgtest/pgcontainer" // a container where a Docker engine answers
)

func TestLockUnlock(t *testing.T) {
	db := pgtest.NewDatabase(t)
	ctx := context.Background()
	if err := shedlock.Create(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	lock := func(holder string, want bool) {
		t.Helper()
		if took, err := shedlock.Lock(ctx, db.Pool, "job", holder, time.Minute); err != nil || took != want {
			t.Fatalf("Lock(%s) = %v, %v; want %v", holder, took, err, want)
		}
	}
	lock("a", true)
	lock("b", false) // held until lock_until
	if err := shedlock.Unlock(ctx, db.Pool, "job", "b", 0); err != nil {
		t.Fatal(err)
	}
	lock("b", false) // another holder's unlock changes nothing
	if err := shedlock.Unlock(ctx, db.Pool, "job", "a", 0); err != nil {
		t.Fatal(err)
	}
	lock("b", true)
	if err := shedlock.Unlock(ctx, db.Pool, "job", "b", time.Hour); err != nil {
		t.Fatal(err)
	}
	lock("a", false) // kept for at least an hour after it was taken
}
