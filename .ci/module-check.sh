#!/usr/bin/env bash
# Module hygiene: seminit and the libraries build for linux, darwin and
# windows, and a consumer module that imports only natssem and amqpsem gets
# no testcontainers or Docker modules in its go.sum.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

for os in linux darwin windows; do
	GOOS=$os GOARCH=amd64 go build ./...
	echo "builds for $os"
done

consumer=$(mktemp -d)
trap 'rm -rf "$consumer"' EXIT
cat >"$consumer/go.mod" <<EOM
module example.com/consumer

go 1.26

require github.com/tokensem/tokensem v0.0.0

replace github.com/tokensem/tokensem => $root
EOM
cat >"$consumer/main.go" <<'EOM'
package main

import (
	_ "github.com/tokensem/tokensem/amqpsem"
	_ "github.com/tokensem/tokensem/natssem"
)

func main() {}
EOM
(cd "$consumer" && go mod tidy >/dev/null 2>&1 && go build ./...)
if grep -E -i 'testcontainers|docker' "$consumer/go.sum"; then
	echo "a consumer of natssem and amqpsem gets the lines above in its go.sum" >&2
	exit 1
fi
echo "a consumer's go.sum has $(wc -l <"$consumer/go.sum") lines, none of testcontainers or Docker"
