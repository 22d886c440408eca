package pgclaim_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim"
)

// Every instance migrates at start-up; concurrent calls are safe.
func ExampleMigrate() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := pgclaim.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	status, err := pgclaim.MigrationStatus(ctx, pool)
	if err != nil {
		log.Fatal(err)
	}
	for _, m := range status {
		fmt.Println(m.Version, m.Name, m.Applied)
	}
}
