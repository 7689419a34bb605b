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
	raiseDieBy() // exec's command died of the keyboard's Ctrl-C or Ctrl-\: so does seminit
	os.Exit(code)
}
