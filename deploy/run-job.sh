#!/usr/bin/env bash
# Run deploy/job.json on the compose cluster and exit with the job's status: 0 when the feed
# saw every iteration committed and every worker exited 0, otherwise the feed's (or the
# first failed worker's) exit code.
#
#   deploy/run-job.sh                                   # build if needed, train, report
#   deploy/run-job.sh -f deploy/docker-compose.tls.yml  # more compose files or options
#   deploy/run-job.sh --stop                            # and stop the cluster afterwards
#
# Arguments other than --stop go to compose before `up` (extra `-f` files, `-p NAME`, ...);
# deploy/docker-compose.yml always comes first. Every container is recreated, so a failed
# run started again resumes from the newest checkpoint on the `snapshots` volume
# (docs/failure-and-recovery.md#resuming-a-deployed-run); `down -v` starts the next job
# afresh.
#
# Afterwards the servers keep serving the trained model (the Staged shard holds its rows
# only in memory) and Prometheus and Grafana keep the run's metrics. With --stop, or later
# with `stop`, the containers stop and the volumes stay: the Cached shard's LMDB
# (`ps-1-data`), the checkpoints (`snapshots`) and every container's log.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
stop=0
options=(-f "$here/docker-compose.yml")
for arg in "$@"; do
  if [[ $arg == --stop ]]; then stop=1; else options+=("$arg"); fi
done
if docker compose version >/dev/null 2>&1; then
  compose=(docker compose "${options[@]}")
elif command -v docker-compose >/dev/null; then
  compose=(docker-compose "${options[@]}")
else
  echo "run-job: neither 'docker compose' nor 'docker-compose' is installed" >&2
  exit 127
fi

say() { echo "run-job: $*" >&2; }

container() {  # the container id of a service ("" when it has none)
  "${compose[@]}" ps -q "$1" 2>/dev/null | head -1
}

say "starting the cluster (every container recreated)"
"${compose[@]}" up -d --force-recreate

feed=$(container feed)
if [[ -z $feed ]]; then
  say "no feed container was created; see: ${compose[*]} ps -a"
  exit 1
fi
say "training: waiting for the feed (logs: ${compose[*]} logs -f feed)"
status=$(docker wait "$feed")
say "feed exited $status"

# The workers exit once the last plans are done: give them as long as the feed waits per
# RPC, or 30 s when the feed failed (an aborted run ends them too; one still running then is
# reported, not waited for).
patience=300
[[ $status == 0 ]] || patience=30
for service in $("${compose[@]}" config --services | grep '^worker-' || true); do
  id=$(container "$service")
  [[ -n $id ]] || continue
  if code=$(timeout "$patience" docker wait "$id"); then
    say "$service exited $code"
  else
    code=124
    say "$service still runs after ${patience} s"
  fi
  if [[ $status == 0 && $code != 0 ]]; then
    status=$code
  fi
done

if [[ $status != 0 ]]; then
  say "the job failed; the last lines of the feed's log:"
  docker logs --tail 20 "$feed" >&2 || true
  say "every service's state: ${compose[*]} ps -a"
fi
if ((stop)); then
  say "stopping the cluster (volumes kept)"
  "${compose[@]}" stop >/dev/null 2>&1 || true
else
  say "the servers keep serving the model; stop them with: ${compose[*]} stop"
fi
exit "$status"
