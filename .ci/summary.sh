#!/usr/bin/env bash
# Prints, after a failed test run, what a reader of the log's tail needs:
# the failures, the tests a timeout caught running, the goroutines of our
# own code in a timeout's dump, and the broker's state. CI shows only the
# end of its output, and a timeout's dump of the embedded NATS server's
# goroutines would otherwise fill all of it.
set -uo pipefail
log=$1

echo
echo "== summary of the failed test run"
echo "-- failures"
grep -E -- '^(--- FAIL|FAIL|panic:)|^ +--- FAIL|^ +[a-z_]+_test\.go:[0-9]+:' "$log" | head -60

echo "-- tests running at a timeout"
awk '/^panic: test timed out/ {p=1} p && /^$/ {exit} p' "$log" | head -30

echo "-- goroutines in tokensem code at a timeout (first 12)"
awk -v max=12 '
	/^goroutine [0-9]+ \[/ { if (blk ~ /tokensem\/tokensem\// && n < max) { print blk; n++ } blk = $0 "\n"; next }
	blk != "" { blk = blk $0 "\n" }
	END { if (blk ~ /tokensem\/tokensem\// && n < max) print blk }
' "$log" | grep -v -E '^\s+/root/go/pkg/mod/' | head -200

echo "-- broker"
timeout 20 rabbitmq-diagnostics -q alarms 2>&1 | head -10
timeout 20 rabbitmqctl -q list_queues name type messages_ready messages_unacknowledged consumers 2>&1 | head -40
timeout 20 rabbitmqctl -q list_connections name state channels 2>&1 | head -20
df -h / 2>&1 | tail -1
