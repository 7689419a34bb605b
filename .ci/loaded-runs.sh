#!/bin/bash
# Runs the chaos package and the seminit CLI tests N times (default 20)
# beside two CPU hogs, from a fresh clone of this repository's HEAD, and
# prints one line per run: the flakiness proof issue 10 asks for.
#   bash .ci/loaded-runs.sh [N]
# Needs the brokers up: bash .ci/rabbitmq.sh, bash .ci/rabbitmq-cluster.sh up
# and (for a second cluster) TOKENSEM_RMQ_CLUSTER=2 bash .ci/rabbitmq-cluster.sh up.
# Logs: $TMPDIR/loaded-run-I.log; python3 .ci/loaded-summary.py $TMPDIR tabulates them. Do not run .ci/run on the same machine
# meanwhile: it restarts cluster nodes the node-loss tests kill.
set -u
n=${1:-20}
root=$(git rev-parse --show-toplevel)
work=$(mktemp -d)
git clone -q "$root" "$work/src"
cd "$work/src"
echo "commit $(git log --oneline -1)"
RABBITMQ_CLUSTER_URLS=$(bash .ci/rabbitmq-cluster.sh urls)
if [ "$(TOKENSEM_RMQ_CLUSTER=2 bash .ci/rabbitmq-cluster.sh status 2>/dev/null | grep -c "@localhost	up	")" = 3 ]; then
	RABBITMQ_CLUSTER_URLS="$RABBITMQ_CLUSTER_URLS;$(TOKENSEM_RMQ_CLUSTER=2 bash .ci/rabbitmq-cluster.sh urls)"
fi
export RABBITMQ_CLUSTER_URLS CI=true
export RABBITMQ_URL=${RABBITMQ_URL:-amqp://guest:guest@127.0.0.1:5672/}
yes >/dev/null & y1=$!
yes >/dev/null & y2=$!
trap 'kill $y1 $y2 2>/dev/null' EXIT
pass=0
for i in $(seq 1 "$n"); do
	start=$(date +%s)
	log=${TMPDIR:-/tmp}/loaded-run-$i.log
	go test -race -count=1 -timeout 20m -v ./chaos/ ./cmd/seminit/ >"$log" 2>&1
	rc=$?
	[ $rc -eq 0 ] && pass=$((pass + 1))
	echo "run $i: exit $rc in $(($(date +%s) - start))s; $(grep -E '^(ok|FAIL)' "$log" | tr '\n' ' ')"
done
echo "$pass of $n passed"
