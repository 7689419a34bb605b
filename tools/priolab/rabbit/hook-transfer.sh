#!/usr/bin/env bash
# hook-transfer.sh QUEUE: move the quorum queue's leader to another node of cluster 2 (ra:transfer_leadership; 3.10 has no CLI for it).
set -u
C="env TOKENSEM_RMQ_CLUSTER=2 bash $(cd "$(dirname "$0")/../../.." && pwd)/.ci/rabbitmq-cluster.sh"
Q=$1
L=$($C leader "$Q"); echo "leader before: $L" >&2
for T in tsc tsb tsa; do [ "$T" != "$L" ] && break; done
$C ctl "$L" eval "{ok,Q}=rabbit_amqqueue:lookup(rabbit_misc:r(<<\"/\">>,queue,<<\"$Q\">>)), {RaName,_}=amqqueue:get_pid(Q), ra:transfer_leadership({RaName,'$L@localhost'},{RaName,'$T@localhost'})." >&2
sleep 1
echo "leader after (target $T): $($C leader "$Q")" >&2
