package pgcontainer

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"

	"github.com/pgclaim/pgclaim/pgtest"
)

// Image is the image started when a Docker engine answers. Override it with
// the PGCLAIM_TEST_IMAGE environment variable.
const Image = "postgres:15-alpine"

// EnvImage names the environment variable that overrides Image.
const EnvImage = "PGCLAIM_TEST_IMAGE"

func init() { pgtest.UseContainers(Start) }

// errNoEngine is returned when no Docker engine answers.
var errNoEngine = errors.New("no Docker engine answered")

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

// Start starts Image (or PGCLAIM_TEST_IMAGE) and returns the connection
// string of its superuser on the maintenance database and a function that
// removes the container. It fails at once when no Docker engine answers.
// It is a pgtest.ContainerProvider; importing the package registers it.
func Start(ctx context.Context) (url string, remove func() error, err error) {
	if ok, err := dockerAnswers(ctx); !ok {
		return "", nil, err
	}
	img := os.Getenv(EnvImage)
	if img == "" {
		img = Image
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
		return "", nil, fmt.Errorf("start container %s: %w", img, err)
	}
	remove = func() error { return testcontainers.TerminateContainer(c) }
	u, err := c.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		_ = remove()
		return "", nil, err
	}
	// testcontainers' reaper removes the container when the process exits;
	// remove does it at once.
	return u, remove, nil
}
