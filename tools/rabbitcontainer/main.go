// Command rabbitcontainer starts RabbitMQ in a Docker container with
// testcontainers-go, for running tokensem's tests where Docker runs but
// rabbitmq-server is not installed:
//
//	export RABBITMQ_URL=$(cd tools/rabbitcontainer && go run .)
//	go test -race -count=1 ./...
//	(cd tools/rabbitcontainer && go run . -stop)
//
// It prints the container's AMQP URL and leaves the container running
// (labelled, with testcontainers' reaper disabled for it); -stop removes
// it. It is a module of its own, so that testcontainers and Docker's client
// are never a dependency of tokensem: without Docker, use
// .ci/rabbitmq.sh (Debian's rabbitmq-server) as CI does.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/modules/rabbitmq"
)

// Image is the container image started.
const Image = "rabbitmq:4-management"

// label marks the container this tool started.
const label = "io.tokensem.rabbitcontainer"

func main() {
	stop := flag.Bool("stop", false, "remove the container started before")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := run(ctx, *stop); err != nil {
		fmt.Fprintln(os.Stderr, "rabbitcontainer:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, stop bool) (err error) {
	// testcontainers-go panics ("rootless Docker not found") on machines
	// with no Docker engine at all.
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("no Docker engine: %v", r)
		}
	}()
	// The container must outlive this process: no reaper.
	if err := os.Setenv("TESTCONTAINERS_RYUK_DISABLED", "true"); err != nil {
		return err
	}
	if stop {
		return removeLabelled(ctx)
	}
	c, err := rabbitmq.Run(ctx, Image, testcontainers.WithLabels(map[string]string{label: "1"}))
	if err != nil {
		return fmt.Errorf("start %s: %w", Image, err)
	}
	url, err := c.AmqpURL(ctx)
	if err != nil {
		_ = testcontainers.TerminateContainer(c)
		return err
	}
	fmt.Println(url)
	return nil
}

// removeLabelled removes the containers this tool started.
func removeLabelled(ctx context.Context) error {
	p, err := testcontainers.NewDockerProvider()
	if err != nil {
		return err
	}
	defer p.Close()
	list, err := p.Client().ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", label))})
	if err != nil {
		return err
	}
	for _, c := range list {
		if err := p.Client().ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true}); err != nil {
			return err
		}
	}
	return nil
}
