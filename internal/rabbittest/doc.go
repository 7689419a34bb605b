// Package rabbittest finds a real RabbitMQ for tests: the one named by
// $RABBITMQ_URL (CI installs Debian's rabbitmq-server and sets it, see
// .ci/rabbitmq.sh; with Docker, tools/rabbitcontainer starts a container and
// prints its URL), and the 3-node clusters of .ci/rabbitmq-cluster.sh named
// by $RABBITMQ_CLUSTER_URLS (see ClusterEnv). Without them, tests are skipped, except under
// CI=true, where a missing broker is a failure.
package rabbittest
