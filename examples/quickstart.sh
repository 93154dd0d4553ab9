#!/usr/bin/env bash
# Start two heraldps shards on 127.0.0.1:7001/7002, run examples/quickstart.py
# against them, then stop them with SIGTERM (as Kubernetes would).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
heraldps ps --host 127.0.0.1 --port 7001 --shard-index 0 --num-shards 2 --metrics-port 9101 &
shard0=$!
heraldps ps --host 127.0.0.1 --port 7002 --shard-index 1 --num-shards 2 --metrics-port 9102 &
shard1=$!
trap 'kill -TERM "$shard0" "$shard1" 2>/dev/null || true; wait "$shard0" "$shard1" || true' EXIT
python "$here/quickstart.py" 127.0.0.1:7001 127.0.0.1:7002
