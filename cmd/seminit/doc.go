// Command seminit creates, inspects and uses tokensem semaphores, and runs
// an embedded NATS server for local use. Run `seminit help` for usage.
package main
