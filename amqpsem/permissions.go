package amqpsem

// The synchronous operations of a channel, with refusals named. A publish
// is refused later, by closing the channel: see channel.refused.

// Permissions are the RabbitMQ permissions of a user in a vhost: three
// regular expressions over the names of queues and exchanges, as
// `rabbitmqctl set_permissions -p VHOST USER CONFIGURE WRITE READ` takes
// them. A user whose permissions do not allow an operation gets an error
// wrapping tokensem.ErrPermissionDenied that names the resource and the
// permission, at once, without retries.
//
// Every resource of semaphore NAME is named tokensem.NAME or
// tokensem.NAME.SUFFIX (and its gate's tokensem._gate_NAME...), and names
// cannot contain '.' or start with '_', so the patterns of one semaphore
// match no resource of another, whatever the names (a and a-b, say).
type Permissions struct {
	Configure, Write, Read string
}

// ClientPermissions returns the least permissions that let a user acquire
// and release permits of semaphore name (Acquire, TryAcquire, weighted
// AcquireN, which makes the semaphore's gate on first use), and read its
// Status and Count. They give no right on any exchange but the gate's, and
// no right on any resource of another semaphore. A client may still take,
// hold, purge or acknowledge the semaphore's tokens and claims (its own
// semaphore's availability is in its hands), but cannot admit more holders
// than the permits: it cannot publish tokens or configurations.
//
// A client's orphan check (see WithOrphanRepair) needs an admin's rights
// to repair: with these it logs the refusal and waits on.
func ClientPermissions(name string) Permissions {
	gate := `_gate_` + name + `(\..*)?`
	return Permissions{
		Configure: `^tokensem\.(` + name + `\.claim\.[0-9]+|` + gate + `)$`,
		Write:     `^tokensem\.` + gate + `$`,
		Read:      `^tokensem\.(` + name + `(\.cfg|\.claim\.[0-9]+)?|` + gate + `)$`,
	}
}

// AdminPermissions returns the least permissions that let a user
// administer semaphore name: Init, Resize, reconcile (Inventory), Delete
// and ForceDelete, and all a client does. They reach no resource of
// another semaphore: every write goes through the semaphore's own
// exchange, and the registry is reached only by publishing an entry to its
// exchange, which List sets up (see OperatorPermissions; an Init before
// the first List fails, naming what it may not set up).
func AdminPermissions(name string) Permissions {
	own := `(_gate_)?` + name + `(\..*)?`
	return Permissions{
		Configure: `^tokensem\.` + own + `$`,
		Write:     `^tokensem\.(` + own + `|\.registry\.x)$`,
		Read:      `^tokensem\.` + own + `$`,
	}
}

// OperatorPermissions returns the least permissions that let a user List
// the semaphores of a vhost: set up, lock and read the registry, publish
// the end marker of its read (write on the registry's exchange, which any
// admin has), and read each semaphore's configuration. Reading lets it
// purge them too: an operator can make any semaphore unusable, though not
// over-admit one.
func OperatorPermissions() Permissions {
	return Permissions{
		Configure: `^tokensem\.\.registry(\.lock|\.x)?$`,
		Write:     `^tokensem\.\.registry(\.x)?$`,
		Read:      `^tokensem\.(\.registry(\.x)?|[^.]+\.cfg)$`,
	}
}
