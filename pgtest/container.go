package pgtest

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
)

// ContainerImage is the image started when a Docker engine answers. Override
// it with the PGCLAIM_TEST_IMAGE environment variable.
const ContainerImage = "postgres:15-alpine"

// dockerAnswers reports whether a Docker engine answers within a short time.
// testcontainers-go panics in some set-ups without an engine; that counts as
// no engine.
func dockerAnswers(ctx context.Context) (ok bool, err error) {
	defer func() {
		if r := recover(); r != nil {
			ok, err = false, fmt.Errorf("%w: %v", errNoEngine, r)
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	cli, err := testcontainers.NewDockerClientWithOpts(ctx)
	if err != nil {
		return false, fmt.Errorf("%w: %v", errNoEngine, err)
	}
	defer cli.Close()
	return true, nil
}

func startContainer(ctx context.Context) (*Server, error) {
	if ok, err := dockerAnswers(ctx); !ok {
		return nil, err
	}
	img := os.Getenv("PGCLAIM_TEST_IMAGE")
	if img == "" {
		img = ContainerImage
	}
	c, err := tcpostgres.Run(ctx, img,
		tcpostgres.WithDatabase("postgres"),
		tcpostgres.WithUsername("postgres"),
		tcpostgres.WithPassword("postgres"),
		tcpostgres.BasicWaitStrategies(),
		testcontainers.WithCmdArgs("-c", "fsync=off", "-c", "full_page_writes=off", "-c", "max_connections=500"),
	)
	if err != nil {
		if c != nil {
			_ = testcontainers.TerminateContainer(c)
		}
		return nil, fmt.Errorf("start container %s: %w", img, err)
	}
	u, err := c.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		_ = testcontainers.TerminateContainer(c)
		return nil, err
	}
	if err := waitReady(ctx, u, nil); err != nil {
		_ = testcontainers.TerminateContainer(c)
		return nil, err
	}
	// The container is removed by testcontainers' reaper when the process
	// exits; Close removes it at once.
	return &Server{
		source:   SourceContainer,
		adminURL: u,
		close:    func() error { return testcontainers.TerminateContainer(c) },
	}, nil
}
