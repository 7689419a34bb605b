// Package embedded runs a NATS server with JetStream inside the current
// process: the local default of tokensem, used by its tests, examples and
// `seminit server`. It listens on loopback unless told otherwise.
package embedded
