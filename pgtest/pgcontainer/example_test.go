package pgcontainer_test

import (
	"context"
	"fmt"

	"github.com/pgclaim/pgclaim/pgtest/pgcontainer"
)

// Tests need only the import for its effect (import _
// "github.com/pgclaim/pgclaim/pgtest/pgcontainer"): pgtest.Shared,
// NewDatabase and Pool then try a container before local binaries. A
// program can also start one itself.
func ExampleStart() {
	url, remove, err := pgcontainer.Start(context.Background())
	if err != nil {
		fmt.Println("no container:", err) // e.g. no Docker engine answered
		return
	}
	defer remove()
	fmt.Println("PostgreSQL at", url)
}
