#!/bin/sh
# Berth's runner and GitLab's gitlab-runner, each with the shell executor and
# `concurrent = 2`, on the same coordinator (berth server) and the same
# generated fan-out/fan-in pipeline (berth bench run --print-pipeline). Prints
# each pipeline's wall time, from its creation to its end, per runner.
#
# usage: bench/runners.sh GITLAB_RUNNER [JOBS] [RUNS]
#   BERTH=path/to/berth (default: berth on PATH)
#   CHECK_INTERVAL=seconds (default 3, GitLab's default check_interval)
set -eu
glr=${1:?usage: bench/runners.sh GITLAB_RUNNER [JOBS] [RUNS]}
jobs=${2:-20}
runs=${3:-3}
berth=${BERTH:-berth}
tmp=$(mktemp -d)
srv=
runner=
cleanup() {
	[ -z "$runner" ] || kill "$runner" 2>/dev/null || true
	[ -z "$srv" ] || kill "$srv" 2>/dev/null || true
	wait 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

port=$(( 20000 + $$ % 20000 ))
url=http://127.0.0.1:$port
export BERTH_ADMIN_TOKEN=bench-admin-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')
"$berth" server --data "$tmp/data" --listen 127.0.0.1:$port --log-level warn 2>"$tmp/server.log" &
srv=$!
i=0
until curl -fsS "$url/-/health" >/dev/null 2>&1 || curl -fsS "$url/api/v4/version" >/dev/null 2>&1; do
	i=$((i + 1)); [ $i -lt 100 ] || { cat "$tmp/server.log"; exit 1; }
	sleep 0.1
done

mkdir "$tmp/project"
"$berth" bench run --print-pipeline --jobs "$jobs" >"$tmp/project/.gitlab-ci.yml"

now() { date +%s.%N; }

for kind in berth gitlab-runner; do
	token=$("$berth" runners create --server "$url" --run-untagged --description "bench $kind")
	mkdir -p "$tmp/$kind"
	cat >"$tmp/$kind/config.toml" <<TOML
concurrent = 2
check_interval = ${CHECK_INTERVAL:-3}
[[runners]]
  name = "bench-$kind"
  url = "$url"
  token = "$token"
  executor = "shell"
  builds_dir = "$tmp/$kind/builds"
  cache_dir = "$tmp/$kind/cache"
TOML
	if [ "$kind" = berth ]; then
		"$berth" runner run -c "$tmp/$kind/config.toml" >"$tmp/$kind/log" 2>&1 &
	else
		"$glr" run -c "$tmp/$kind/config.toml" --working-directory "$tmp/$kind" >"$tmp/$kind/log" 2>&1 &
	fi
	runner=$!
	sleep 2 # the runner's first request
	for r in $(seq "$runs"); do
		start=$(now)
		id=$("$berth" pipelines create --server "$url" --project "bench/$kind" "$tmp/project" 2>/dev/null)
		"$berth" pipelines wait --server "$url" "$id" >/dev/null || { echo "$kind: pipeline $id failed"; tail -20 "$tmp/$kind/log"; exit 1; }
		end=$(now)
		printf '%-14s run %d  %d jobs  %.2f s\n' "$kind" "$r" "$jobs" "$(echo "$end - $start" | bc)"
	done
	kill "$runner" 2>/dev/null || true
	wait "$runner" 2>/dev/null || true
	runner=
done
