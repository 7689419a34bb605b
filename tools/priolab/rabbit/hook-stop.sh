#!/usr/bin/env bash
# hook-stop.sh QUEUE HOLDERNODE: stop_app the quorum queue's leader node of cluster 2 (refuses if it is HOLDERNODE).
set -u
C="env TOKENSEM_RMQ_CLUSTER=2 bash $(cd "$(dirname "$0")/../../.." && pwd)/.ci/rabbitmq-cluster.sh"
Q=$1
L=$($C leader "$Q"); echo "leader before: $L" >&2
[ "$L" = "$2" ] && { echo "leader is the holder's node; not stopping" >&2; exit 1; }
echo "$L" > /tmp/prio-exp-stopped-node
$C ctl "$L" stop_app >&2
sleep 2
for n in tsa tsb tsc; do [ "$n" != "$L" ] && { echo "leader after: $($C leader "$Q")" >&2; break; }; done
