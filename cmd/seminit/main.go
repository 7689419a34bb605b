package main

import (
	"context"
	"os"
)

func main() {
	ctx, cancel := context.WithCancelCause(context.Background())
	sigs, stop := listenSignals(cancel)
	code := run(ctx, sigs, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
