#!/bin/sh
# run_exec: run one stage's script in the job's container.
#   run.sh [run_args…] <script> <stage>
# The script's exit status: 0 → exit 0; any other → written to
# BUILD_EXIT_CODE_FILE, exit BUILD_FAILURE_EXIT_CODE. Docker failing, or
# the container gone → exit SYSTEM_FAILURE_EXIT_CODE.
. "$(dirname "$0")/base.sh"

script= stage=
for a in "$@"; do
	script=$stage
	stage=$a
done
[ -f "$script" ] || fail_system "usage: run.sh [args…] <script> <stage>"

# The stage's marker: the runner's (BERTH_STAGE_MARKER), else a fresh one.
marker=${BERTH_STAGE_MARKER:-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')}
case $marker in
'' | *[!A-Za-z0-9._-]*) fail_system "stage marker '$marker' has unexpected characters" ;;
esac
status=$status_dir/$marker.status
rm -f "$status" "$status.stop"

# The runner's script names its shell on its first line (#!/usr/bin/env
# bash or sh); images without bash get sh.
shell=sh
case $(head -n 1 "$script") in
*bash) shell=bash ;;
esac

# shellcheck disable=SC2016 # runs in the container
# The wrapper runs the stage, then kills what the stage left behind and
# records its exit status. When the stage is being stopped (the stopper
# made <status>.stop first), it leaves the rest to the stopper, which
# gives the stage's processes their grace period.
wrapper=$in_container'
status=$1 shell=$2
marker=$BERTH_CUSTOM_DOCKER_STAGE
trap : TERM
if [ "$shell" = bash ] && command -v bash >/dev/null 2>&1; then bash -s; else sh -s; fi
rc=$?
unset BERTH_CUSTOM_DOCKER_STAGE
[ -e "$status.stop" ] && exit "$rc"
kill_all "$marker"
echo "$rc" >"$status"
exit "$rc"
'
# shellcheck disable=SC2016 # runs in the container
stopper=$in_container'
: >"$3.stop"
reap TERM "$1" || exit 0
i=0
while reap 0 "$1" && [ "$i" -lt $(($2 * 10)) ]; do
	sleep 0.1
	i=$((i + 1))
done
kill_all "$1"
'

# Canceled or timed out: the runner sends SIGTERM to this driver's
# process group, which ends the docker client but not the stage in the
# container. Stop the stage there, gracefully first.
child=
stop() {
	trap '' TERM INT # once is enough: finish stopping
	docker exec "$container" sh -c "$stopper" stop "$marker" "$stop_timeout" "$status" >/dev/null 2>&1 || :
	[ -z "$child" ] || wait "$child" 2>/dev/null || :
	rm -f "$status" "$status.stop"
	fail_system "stage $stage stopped"
}
trap stop TERM INT

docker exec -i -e "BERTH_CUSTOM_DOCKER_STAGE=$marker" "$container" \
	sh -c "$wrapper" stage "$status" "$shell" <"$script" &
child=$!

rc=0
wait "$child" || rc=$?
trap - TERM INT

if [ -s "$status" ]; then
	code=$(cat "$status")
	rm -f "$status"
	case $code in
	'' | *[!0-9]*) fail_system "stage $stage: unreadable exit status '$code'" ;;
	esac
	[ "$code" -eq 0 ] && exit 0
	echo "$code" >"$BUILD_EXIT_CODE_FILE"
	exit "$build_failure"
fi
state=$(docker inspect --format '{{.State.Status}}' "$container" 2>&1) || :
fail_system "stage $stage did not run to its end in container $container (docker exec: exit $rc, container: $state)"
