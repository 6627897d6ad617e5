# shellcheck shell=sh
# Settings and helpers shared by the driver's programs (config.sh,
# prepare.sh, run.sh, cleanup.sh), which source this file.
#
# Settings, from the runner's environment (the driver ignores job
# variables for them: a job must not choose where its files go):
#
#   BERTH_CUSTOM_DOCKER_IMAGE         image of jobs without image:
#                                     (default berth-test/debian:bookworm)
#   BERTH_CUSTOM_DOCKER_DIR           host directory holding builds/ and cache/
#                                     (default /var/lib/berth-custom-docker)
#   BERTH_CUSTOM_DOCKER_PULL          missing (default), never or always
#   BERTH_CUSTOM_DOCKER_STOP_TIMEOUT  seconds a canceled stage's processes get
#                                     between SIGTERM and SIGKILL (default 10)
#
# The Docker daemon must be local: directories are bind-mounted at the
# same paths inside the job's container.

set -eu

driver_name=berth-docker-example
driver_version=1.0.0
label=com.berthci.custom-docker

default_image=${BERTH_CUSTOM_DOCKER_IMAGE:-berth-test/debian:bookworm}
base_dir=${BERTH_CUSTOM_DOCKER_DIR:-/var/lib/berth-custom-docker}
pull=${BERTH_CUSTOM_DOCKER_PULL:-missing}
stop_timeout=${BERTH_CUSTOM_DOCKER_STOP_TIMEOUT:-10}

build_failure=${BUILD_FAILURE_EXIT_CODE:-1}
system_failure=${SYSTEM_FAILURE_EXIT_CODE:-2}

# fail_system and fail_build end the program with the protocol's exit
# codes: the environment failed / the job is at fault.
fail_system() {
	echo "$driver_name: $*" >&2
	exit "$system_failure"
}
fail_build() {
	echo "$driver_name: $*" >&2
	exit "$build_failure"
}

# Paths end up in JSON and in docker's --mount lists: keep them plain.
case $base_dir in
/*) ;;
*) fail_system "BERTH_CUSTOM_DOCKER_DIR $base_dir: must be an absolute path" ;;
esac
case $base_dir in
*[!A-Za-z0-9/._-]*) fail_system "BERTH_CUSTOM_DOCKER_DIR $base_dir: only letters, digits and / . _ - please" ;;
esac
case $pull in
missing | never | always) ;;
*) fail_system "BERTH_CUSTOM_DOCKER_PULL $pull: want missing, never or always" ;;
esac
case $stop_timeout in
'' | *[!0-9]*) fail_system "BERTH_CUSTOM_DOCKER_STOP_TIMEOUT $stop_timeout: want whole seconds" ;;
esac

builds_dir=$base_dir/builds
cache_dir=$base_dir/cache

# The container of the job: one per runner (short token) and job.
runner=${CUSTOM_ENV_CI_RUNNER_SHORT_TOKEN:-}
job=${CUSTOM_ENV_CI_JOB_ID:-}
case $runner in
'' | *[!A-Za-z0-9_-]*) fail_system "CUSTOM_ENV_CI_RUNNER_SHORT_TOKEN '$runner' is not a short token" ;;
esac
case $job in
'' | *[!0-9]*) fail_system "CUSTOM_ENV_CI_JOB_ID '$job' is not a job id" ;;
esac
container=berth-custom-$runner-job-$job

# status_dir is the driver's own directory, shared with the container at
# the same path: the stage wrapper leaves each stage's exit status there.
# TMPDIR is the job's private directory on the runner's host.
status_dir=${TMPDIR:?TMPDIR is not set: run by a custom executor}/docker-driver

# in_container are shell functions for inside the container. A stage's
# processes carry BERTH_CUSTOM_DOCKER_STAGE=<marker> in their environment
# (docker exec -e), which every descendant inherits, also those that left
# the process group or session; reap SIG MARKER signals them and
# succeeds when it found any, kill_all MARKER kills them until none is
# left.
# shellcheck disable=SC2016 # expanded inside the container
in_container='
reap() {
	n=0
	for d in /proc/[0-9]*; do
		p=${d#/proc/}
		[ "$p" = "$$" ] && continue
		if tr "\000" "\n" <"$d/environ" 2>/dev/null | grep -qxF "BERTH_CUSTOM_DOCKER_STAGE=$2"; then
			kill "-$1" "$p" 2>/dev/null && n=$((n + 1))
		fi
	done
	[ "$n" -gt 0 ]
}
kill_all() {
	i=0
	while reap KILL "$1" && [ "$i" -lt 50 ]; do i=$((i + 1)); done
}
'
