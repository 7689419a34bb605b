// Package rabbittest finds a real RabbitMQ for tests: the one named by
// $RABBITMQ_URL (CI installs Debian's rabbitmq-server and sets it), else a
// rabbitmq:4-management container started with testcontainers-go when a
// Docker engine answers. Without either, tests are skipped, except under
// CI=true, where a missing broker is a failure.
package rabbittest
