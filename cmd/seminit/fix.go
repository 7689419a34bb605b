package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/amqpsem"
)

// fixFor returns what to run next after verb failed with err, or "" when
// there is no such step: every error a user can meet names its fix where
// one exists. args are the verb's arguments (for the semaphore's name).
func fixFor(verb string, args []string, err error) string {
	name := flagValue(args, "name")
	if name == "" {
		name = "NAME"
	}
	var pm *tokensem.PermitMismatchError
	switch {
	case errors.As(err, &pm):
		return fmt.Sprintf("to change its count live (holders keep their permits): seminit resize --name %s --permits %d", pm.Name, pm.Want)
	case errors.Is(err, tokensem.ErrNotInitialized) && verb != "delete":
		return fmt.Sprintf("create it first: seminit init --name %s --permits N", name)
	case errors.Is(err, tokensem.ErrHeld):
		return fmt.Sprintf("to delete it anyway (its holders lose their permits): seminit delete --force --name %s", name)
	case errors.Is(err, tokensem.ErrLeaseMismatch):
		return "leave --lease out to use the lease it was created with"
	case errors.Is(err, tokensem.ErrKeyMismatch):
		return "give the signing key it was created with (--key-file or $TOKENSEM_KEY), or none if it has none"
	case errors.Is(err, tokensem.ErrInvalidRecord) && verb != "delete":
		return fmt.Sprintf("to remove the semaphore and its damaged records: seminit delete --force --name %s", name)
	case errors.Is(err, tokensem.ErrPriorityUnsupported):
		return fmt.Sprintf("leave --priority out to wait in arrival order, or, once the server is nats-server 2.12 or later, run seminit init --name %s again with its --permits: it makes the semaphore serve classes in place", name)
	case errors.Is(err, nats.ErrNoServers):
		return "no NATS server answers there: start one for local use with `seminit server`, or point --url (or $TOKENSEM_URL) at yours"
	case errors.Is(err, amqpsem.ErrUnreachable):
		return "is RabbitMQ running there? point --url (or $TOKENSEM_URL) at it"
	}
	return ""
}

// flagValue returns the last value given to --flag (or -flag) in args, ""
// if none: a best effort for messages, after the verb parsed its flags.
func flagValue(args []string, flag string) string {
	v := ""
	for i, a := range args {
		if a == "--" {
			break
		}
		a = strings.TrimLeft(a, "-")
		switch {
		case a == flag && i+1 < len(args):
			v = args[i+1]
		case strings.HasPrefix(a, flag+"="):
			v = strings.TrimPrefix(a, flag+"=")
		}
	}
	return v
}
