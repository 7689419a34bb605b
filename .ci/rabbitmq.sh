#!/usr/bin/env bash
# Installs Debian's rabbitmq-server if needed, starts a node on loopback
# unless one already answers, waits for it, and prints the AMQP URL.
set -euo pipefail

url="amqp://guest:guest@127.0.0.1:5672/"

if ! command -v rabbitmq-server >/dev/null 2>&1; then
	echo "installing rabbitmq-server" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq >&2
	apt-get install -y -qq rabbitmq-server >&2
fi

if ! rabbitmqctl -q status >/dev/null 2>&1; then
	echo "starting rabbitmq-server on 127.0.0.1:5672" >&2
	export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_NODE_PORT=5672
	export ERL_EPMD_ADDRESS=127.0.0.1
	# No busy-waiting schedulers: they would eat a core of a 2-core machine.
	export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="+sbwt none +sbwtdcpu none +sbwtdio none"
	# A disk alarm blocks every publisher until it clears; CI machines
	# can run low on disk while the race-enabled test binaries build, and
	# the default limit (50MB) would then stall the tests, not fail them.
	conf=/etc/rabbitmq/tokensem-ci.conf
	mkdir -p /etc/rabbitmq
	echo "disk_free_limit.absolute = 8MB" >"$conf"
	chmod 644 "$conf"
	export RABBITMQ_CONFIG_FILE=$conf
	# Debian's /usr/sbin/rabbitmq-server switches user with su, whose PAM
	# session cuts the soft descriptor limit to 1024; every queue holds
	# files, and a few hundred test queues exhausted that. Start the node
	# as the rabbitmq user ourselves, keeping the hard limit.
	ulimit -n "$(ulimit -Hn)"
	if command -v setpriv >/dev/null 2>&1; then
		(cd /var/lib/rabbitmq && HOME=/var/lib/rabbitmq setpriv --reuid=rabbitmq --regid=rabbitmq --init-groups \
			/usr/lib/rabbitmq/bin/rabbitmq-server -detached >&2)
	else
		rabbitmq-server -detached >&2
	fi
fi
# -detached returns before the node registers with epmd, and await_startup
# fails at once for a node that is not running yet: poll.
for _ in $(seq 1 120); do
	if rabbitmqctl -q await_startup --timeout 5 >/dev/null 2>&1; then
		df -h / /var/lib/rabbitmq >&2 || true
		rabbitmqctl -q status 2>/dev/null | grep -A2 -i "file descriptors" >&2 || true
		rabbitmq-diagnostics -q alarms >&2 || true
		echo "$url"
		exit 0
	fi
	sleep 1
done
echo "rabbitmq-server did not start within 2 minutes" >&2
rabbitmqctl status >&2 || true
exit 1
