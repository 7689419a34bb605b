#!/usr/bin/env bash
# A 3-node RabbitMQ cluster on loopback for tests, next to (and independent
# of) the default node of .ci/rabbitmq.sh. Uses Debian's rabbitmq-server.
#
#   bash .ci/rabbitmq-cluster.sh [up]       start what is missing, cluster, print the URLs
#   bash .ci/rabbitmq-cluster.sh urls       print the URLs (no checks)
#   bash .ci/rabbitmq-cluster.sh url NODE   print one node's URL
#   bash .ci/rabbitmq-cluster.sh status     one line per node, then the running members
#   bash .ci/rabbitmq-cluster.sh stop NODE...   graceful stop (rabbitmqctl stop)
#   bash .ci/rabbitmq-cluster.sh kill NODE...   SIGKILL the node's beam.smp
#   bash .ci/rabbitmq-cluster.sh start NODE...  start stopped/killed nodes on their
#                                               data dirs (in parallel), wait until
#                                               they accept AMQP, join if not a member
#   bash .ci/rabbitmq-cluster.sh pid NODE   the node's beam.smp OS pid (exit 1 if none)
#   bash .ci/rabbitmq-cluster.sh leader QUEUE [VHOST]   short name of the quorum
#                                           queue's leader (e.g. tsa)
#   bash .ci/rabbitmq-cluster.sh ctl NODE ARGS...     rabbitmqctl -n NODE ARGS
#   bash .ci/rabbitmq-cluster.sh queues NODE ARGS...  rabbitmq-queues -n NODE ARGS
#   bash .ci/rabbitmq-cluster.sh down       stop all three (data kept)
#   bash .ci/rabbitmq-cluster.sh wipe       SIGKILL all three and delete the data dir
#
# NODE is tsa, tsb or tsc (also a, b, c, or tsa@localhost). Node X listens
# for AMQP on 127.0.0.1:$TOKENSEM_RMQ_CLUSTER_PORT+i (5681, 5682, 5683) and
# for Erlang distribution on that port + 20000 (25681...). The nodes use
# their own epmd on 127.0.0.1:$TOKENSEM_RMQ_CLUSTER_EPMD_PORT (4391), so
# they never meet the default rabbit@host node, its epmd or its cookie.
# Data, logs, config and the shared cookie live in $TOKENSEM_RMQ_CLUSTER_DIR
# (/tmp/tokensem-rmq-cluster). TOKENSEM_RMQ_CLUSTER=K (see below) shifts
# all of these for a K-th cluster: ports 5691..., 25691..., epmd 4392 and
# /tmp/tokensem-rmq-cluster-2 for K=2. `up` prints one line to stdout, the
# comma-separated URLs; progress and errors go to stderr. Nodes run as the
# calling user, detached from the caller (own session, stdio on log files),
# so a Go test may exec this script and wait for it. Exit status 0 means
# done: `kill` returns once the OS process is gone, `start` and `up` once the
# nodes have booted and accept AMQP.
set -euo pipefail

# TOKENSEM_RMQ_CLUSTER=K (1 by default) picks the K-th of several such
# clusters: its own data dir (the first's with "-K" appended), AMQP ports
# 10*(K-1) higher, and epmd port K-1 higher. go test runs several test
# binaries at once (-p, 2 on CI's 2 cores), and each may need a cluster
# whose nodes it kills.
K=${TOKENSEM_RMQ_CLUSTER:-1}
case $K in
[1-9]) ;;
*) echo "rabbitmq-cluster: TOKENSEM_RMQ_CLUSTER=$K: want 1 to 9" >&2; exit 2 ;;
esac
DIR=${TOKENSEM_RMQ_CLUSTER_DIR:-/tmp/tokensem-rmq-cluster}
DIR=${DIR%/}
PORT0=$((${TOKENSEM_RMQ_CLUSTER_PORT:-5681} + 10 * (K - 1)))
EPMD_PORT=$((${TOKENSEM_RMQ_CLUSTER_EPMD_PORT:-4391} + K - 1))
if [ "$K" != 1 ]; then DIR=$DIR-$K; fi
HOST=localhost
NODES=(tsa tsb tsc)
SEED=tsa
SBIN=/usr/lib/rabbitmq/bin
START_TIMEOUT=${TOKENSEM_RMQ_CLUSTER_START_TIMEOUT:-180}

log() { echo "rabbitmq-cluster: $*" >&2; }
die() { log "$*"; exit 1; }

# short NODE: tsa for tsa, a, A, tsa@localhost.
short() {
	local n=${1%@*}
	case $n in
	a | A | tsa) echo tsa ;;
	b | B | tsb) echo tsb ;;
	c | C | tsc) echo tsc ;;
	*) die "unknown node '$1' (tsa, tsb or tsc)" ;;
	esac
}
index() { case $1 in tsa) echo 0 ;; tsb) echo 1 ;; tsc) echo 2 ;; esac; }
port() { echo $((PORT0 + $(index "$1"))); }
url() { echo "amqp://guest:guest@127.0.0.1:$(port "$1")/"; }
urls() {
	local out="" n
	for n in "${NODES[@]}"; do out+="${out:+,}$(url "$n")"; done
	echo "$out"
}

# cli TOOL NODE ARGS...: a RabbitMQ CLI tool against one of our nodes (our
# epmd, our cookie via HOME, CLI distribution ports away from the default
# node's 35672-35682).
cli() {
	local tool=$1 n=$2
	shift 2
	env HOME="$DIR" ERL_EPMD_PORT="$EPMD_PORT" \
		RABBITMQ_CONF_ENV_FILE="$DIR/rabbitmq-env.conf" \
		RABBITMQ_CTL_DIST_PORT_MIN=35700 RABBITMQ_CTL_DIST_PORT_MAX=35799 \
		"$SBIN/$tool" -n "$n@$HOST" "$@"
}

# answers NODE: the AMQP port accepts connections (cheap: no CLI).
answers() { timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$(port "$1")" 2>/dev/null; }

# isnode PID NODE: PID is NODE's VM: a live beam.smp carrying our marker in
# its environment and booting rabbit. The node's short-lived children
# (rabbit_epmd_monitor runs `erl -sname epmd-starter-...` every minute)
# inherit the environment but not the command line.
isnode() {
	local p=/proc/$1 comm
	read -r comm 2>/dev/null <"$p/comm" || return 1
	[ "$comm" = beam.smp ] || return 1
	grep -qzx "TOKENSEM_RMQ_NODE=$DIR/$2" "$p/environ" 2>/dev/null || return 1
	tr '\0' ' ' 2>/dev/null <"$p/cmdline" | grep -q -- ' -s rabbit boot ' || return 1
	[ "$(awk '{print $3}' "$p/stat" 2>/dev/null)" != Z ] # a zombie has gone
}

# pid NODE: the node's beam.smp: the pid file if it is still right (it is
# stale after a SIGKILL), else a scan of /proc (a node that is booting has
# not written it yet).
pid() {
	local p
	if p=$(cat "$DIR/$1/pid" 2>/dev/null) && [ -n "$p" ] && isnode "$p" "$1"; then
		echo "$p"
		return 0
	fi
	for p in /proc/[0-9]*; do
		p=${p#/proc/}
		if isnode "$p" "$1"; then
			echo "$p"
			return 0
		fi
	done
	return 1
}

prepare() {
	if [ ! -x "$SBIN/rabbitmq-server" ]; then
		log "installing rabbitmq-server"
		export DEBIAN_FRONTEND=noninteractive
		apt-get update -qq >&2
		apt-get install -y -qq rabbitmq-server >&2
	fi
	mkdir -p "$DIR"
	if [ ! -s "$DIR/.erlang.cookie" ]; then
		(umask 077 && od -An -N18 -tx1 /dev/urandom | tr -d ' \n' | tr a-f A-F >"$DIR/.erlang.cookie")
	fi
	chmod 400 "$DIR/.erlang.cookie"
	: >"$DIR/rabbitmq-env.conf" # keeps /etc/rabbitmq/rabbitmq-env.conf out
	echo "[]." >"$DIR/enabled_plugins"
	cat >"$DIR/rabbitmq.conf" <<-'EOF'
		# See .ci/rabbitmq.sh: a disk alarm would stall publishers, not fail tests.
		disk_free_limit.absolute = 8MB
		log.file.level = info
		log.console = false
	EOF
}

# booted NODE: the node logged "Server startup complete" since its launch
# (cheaper than a CLI call: each costs a second or two of CPU).
booted() {
	local f="$DIR/$1/log/$1@$HOST.log" from
	from=$(cat "$DIR/$1/log.offset" 2>/dev/null || echo 0)
	[ -f "$f" ] && tail -c +"$((from + 1))" "$f" | grep -q "Server startup complete"
}

# launch NODE: start the node's VM in the background, detached.
launch() {
	local n=$1 p
	p=$(port "$n")
	mkdir -p "$DIR/$n/mnesia" "$DIR/$n/log"
	stat -c %s "$DIR/$n/log/$n@$HOST.log" >"$DIR/$n/log.offset" 2>/dev/null || echo 0 >"$DIR/$n/log.offset"
	log "starting $n@$HOST on 127.0.0.1:$p"
	(
		# Same descriptor care as .ci/rabbitmq.sh: every queue holds files.
		ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
		cd "$DIR/$n"
		# Unset what a caller may have exported for the default node.
		for v in $(env | awk -F= '/^RABBITMQ_/ {print $1}'); do unset "$v"; done
		export TOKENSEM_RMQ_NODE="$DIR/$n" HOME="$DIR" \
			ERL_EPMD_PORT="$EPMD_PORT" ERL_EPMD_ADDRESS=127.0.0.1 \
			ERL_CRASH_DUMP="$DIR/$n/erl_crash.dump" \
			RABBITMQ_NODENAME="$n@$HOST" \
			RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_NODE_PORT="$p" \
			RABBITMQ_DIST_PORT=$((p + 20000)) \
			RABBITMQ_CONF_ENV_FILE="$DIR/rabbitmq-env.conf" \
			RABBITMQ_CONFIG_FILE="$DIR/rabbitmq.conf" \
			RABBITMQ_ADVANCED_CONFIG_FILE="$DIR/advanced.config" \
			RABBITMQ_ENABLED_PLUGINS_FILE="$DIR/enabled_plugins" \
			RABBITMQ_MNESIA_BASE="$DIR/$n/mnesia" \
			RABBITMQ_LOG_BASE="$DIR/$n/log" \
			RABBITMQ_PID_FILE="$DIR/$n/pid"
		# No busy-waiting schedulers (they would eat a core of a 2-core
		# machine); distribution on loopback only; one scheduler and a
		# smaller process table: three nodes share two cores with the tests.
		export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="+sbwt none +sbwtdcpu none +sbwtdio none +S 1:1 +P 65536 -kernel inet_dist_use_interface {127,0,0,1}"
		exec setsid "$SBIN/rabbitmq-server" >>"$DIR/$n/console.log" 2>&1 </dev/null
	) &
	echo $! >"$DIR/$n/launcher.pid"
}

# await NODE...: wait until each node accepts AMQP and has booted.
await() {
	local n deadline=$((SECONDS + START_TIMEOUT))
	for n in "$@"; do
		until answers "$n" && booted "$n"; do
			if ! kill -0 "$(cat "$DIR/$n/launcher.pid" 2>/dev/null || echo 0)" 2>/dev/null && ! pid "$n" >/dev/null; then
				tail -n 30 "$DIR/$n/console.log" >&2 || true
				die "$n exited while starting (logs: $DIR/$n/console.log, $DIR/$n/log)"
			fi
			[ "$SECONDS" -lt "$deadline" ] || die "$n did not start within ${START_TIMEOUT}s (logs: $DIR/$n/log)"
			sleep 0.2
		done
	done
}

# members NODE: the cluster members NODE knows of (disc nodes, running or not).
members() { cli rabbitmqctl "$1" -q eval 'rabbit_mnesia:cluster_nodes(all).' 2>/dev/null; }
running() { cli rabbitmqctl "$1" -q eval 'rabbit_nodes:all_running().' 2>/dev/null; }
count() { grep -o "@$HOST" | wc -l; }

# join NODE TO: rabbitmqctl join_cluster, the documented way.
join() {
	local n=$1 to=$2
	log "joining $n to $to"
	cli rabbitmqctl "$n" -q stop_app >&2 &&
		cli rabbitmqctl "$n" -q join_cluster "$to@$HOST" >&2 &&
		cli rabbitmqctl "$n" -q start_app >&2
}

# start_nodes NODE...: launch those not running (in parallel), wait for
# them, and join the ones that start without a database: B and C to the
# seed A; A to B or C if only A lost its database.
start_nodes() {
	local n m to fresh=() old=() jobs=() pids=() i rc=0
	prepare
	for n in "$@"; do
		if pid "$n" >/dev/null; then continue; fi
		if [ -d "$DIR/$n/mnesia/$n@$HOST" ]; then old+=("$n"); else fresh+=("$n"); fi
		launch "$n"
	done
	await "$@"
	for n in "${fresh[@]}"; do
		to=""
		if [ "$n" != "$SEED" ]; then
			to=$SEED
		else
			for m in "${NODES[@]}"; do
				[ "$m" != "$n" ] && [ -d "$DIR/$m/mnesia/$m@$HOST" ] && answers "$m" &&
					[ "$(members "$m" | count)" -gt 1 ] && { to=$m; break; }
			done
		fi
		[ -n "$to" ] || continue
		answers "$to" || die "$n cannot join $to: $to is down"
		# B and C join A at the same time: Mnesia serialises the schema changes.
		join "$n" "$to" &
		jobs+=("$n")
		pids+=($!)
	done
	for i in "${!pids[@]}"; do
		wait "${pids[$i]}" || { log "joining ${jobs[$i]} failed"; rc=1; }
	done
	return "$rc"
}

cmd_up() {
	local n ok=1
	for n in "${NODES[@]}"; do answers "$n" || { ok=0; break; }; done
	if [ "$ok" = 1 ] && [ "$(running "$SEED" | count)" = 3 ]; then
		urls
		return 0
	fi
	start_nodes "${NODES[@]}" || true
	if [ "$(running "$SEED" | count)" != 3 ]; then
		# A join failed or an old node is not a member: join what is missing.
		for n in "${NODES[@]}"; do
			[ "$n" = "$SEED" ] || members "$SEED" | grep -q "$n@$HOST" || join "$n" "$SEED"
		done
		[ "$(running "$SEED" | count)" = 3 ] || {
			cli rabbitmqctl "$SEED" cluster_status >&2 || true
			die "the cluster did not form"
		}
	fi
	urls
}

cmd_stop() {
	local n p
	for n in "$@"; do
		n=$(short "$n")
		p=$(pid "$n") || { log "$n is not running"; continue; }
		log "stopping $n (pid $p)"
		cli rabbitmqctl "$n" -q stop >&2 || true
		wait_gone "$n" "$p"
	done
}

cmd_kill() {
	local n p
	for n in "$@"; do
		n=$(short "$n")
		p=$(pid "$n") || { log "$n is not running"; continue; }
		log "SIGKILL $n (pid $p)"
		kill -KILL "$p"
		wait_gone "$n" "$p"
	done
}

wait_gone() {
	local n=$1 p=$2 i
	for i in $(seq 1 300); do
		if [ ! -e "/proc/$p" ] || [ "$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null)" = Z ]; then
			return 0
		fi
		sleep 0.1
	done
	die "$n (pid $p) is still running"
}

cmd_status() {
	local n p st
	for n in "${NODES[@]}"; do
		if p=$(pid "$n"); then
			if answers "$n"; then st=up; else st=starting; fi
		else
			p=-
			st=down
		fi
		printf '%s@%s\t%s\tpid=%s\t%s\n' "$n" "$HOST" "$st" "$p" "$(url "$n")"
	done
	for n in "${NODES[@]}"; do
		if answers "$n"; then
			printf 'members (from %s): %s\n' "$n" "$(members "$n" | tr -d '\n')"
			printf 'running (from %s): %s\n' "$n" "$(running "$n" | tr -d '\n')"
			return 0
		fi
	done
}

cmd_leader() {
	local q=${1:?leader QUEUE [VHOST]} vhost=${2:-/} n l
	for n in "${NODES[@]}"; do
		answers "$n" || continue
		l=$(cli rabbitmqctl "$n" -q list_queues -p "$vhost" --no-table-headers name leader 2>/dev/null |
			awk -F'\t' -v q="$q" '$1 == q {print $2}') || continue
		[ -n "$l" ] || die "no quorum queue '$q' in vhost '$vhost' (or no leader)"
		echo "${l%@*}"
		return 0
	done
	die "no node answers"
}

main() {
	local c=${1:-up}
	[ $# -gt 0 ] && shift
	case $c in
	up) cmd_up ;;
	urls) urls ;;
	url) url "$(short "${1:?url NODE}")" ;;
	status) cmd_status ;;
	stop) cmd_stop "${@:?stop NODE...}" ;;
	kill) cmd_kill "${@:?kill NODE...}" ;;
	start)
		local ns=() n
		for n in "${@:?start NODE...}"; do ns+=("$(short "$n")"); done
		start_nodes "${ns[@]}"
		;;
	pid) pid "$(short "${1:?pid NODE}")" ;;
	leader) cmd_leader "$@" ;;
	ctl)
		n=$(short "${1:?ctl NODE ARGS...}")
		shift
		cli rabbitmqctl "$n" "$@"
		;;
	queues)
		n=$(short "${1:?queues NODE ARGS...}")
		shift
		cli rabbitmq-queues "$n" "$@"
		;;
	down) cmd_stop "${NODES[@]}" ;;
	wipe)
		cmd_kill "${NODES[@]}"
		rm -rf "$DIR"
		;;
	*) die "unknown command '$c' (up, urls, url, status, stop, kill, start, pid, leader, ctl, queues, down, wipe)" ;;
	esac
}

main "$@"
