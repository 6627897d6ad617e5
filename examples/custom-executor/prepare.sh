#!/bin/sh
# prepare_exec: start the job's throw-away container. It runs until
# cleanup.sh removes it; every stage runs in it through docker exec.
. "$(dirname "$0")/base.sh"

image=${CUSTOM_ENV_CI_JOB_IMAGE:-$default_image}
# The image name is the job's: it must not pass for an option of docker
# run (--privileged).
case $image in
-* | *[!A-Za-z0-9._/:@-]*) fail_build "image name '$image' is not valid" ;;
esac

# CI_BUILDS_DIR (this job's <builds>/<runner>/<concurrency id>) and
# CI_PROJECT_DIR are set by the runner; the job cannot change them. Still,
# nothing outside the driver's directories is mounted.
slot_dir=${CUSTOM_ENV_CI_BUILDS_DIR:?CUSTOM_ENV_CI_BUILDS_DIR is not set}
project_dir=${CUSTOM_ENV_CI_PROJECT_DIR:?CUSTOM_ENV_CI_PROJECT_DIR is not set}
case $slot_dir in
"$builds_dir" | "$builds_dir"/*) ;;
*) fail_system "builds directory $slot_dir is not below $builds_dir" ;;
esac
case $project_dir in
"$slot_dir"/?*) ;;
*) fail_system "project directory $project_dir is not below $slot_dir" ;;
esac
project=${project_dir#"$slot_dir"/}
case /$project/ in
*/../* | */./* | *//*) fail_system "project path $project: empty, . or .. component" ;;
esac
for p in "$slot_dir" "$project" "$status_dir"; do
	case $p in
	*[!A-Za-z0-9/._-]*) fail_system "path $p: only letters, digits and / . _ - please" ;;
	esac
done
cache_project=$cache_dir/$project

echo "Preparing container $container from $image"

case $pull in
always) docker pull "$image" || fail_system "pulling $image failed" ;;
*)
	if ! docker image inspect "$image" >/dev/null 2>&1; then
		[ "$pull" = never ] && fail_build "image $image is not present and BERTH_CUSTOM_DOCKER_PULL is never"
		docker pull "$image" || fail_system "pulling $image failed"
	fi
	;;
esac

mkdir -p "$slot_dir" "$cache_project" "$status_dir"
chmod 0777 "$status_dir" # the job's user may be anyone

# A container of the same name is a leftover of this very job (a crashed
# runner manager, an earlier attempt of this preparation).
docker rm -f "$container" >/dev/null 2>&1 || :

set -- \
	--mount "type=bind,source=$slot_dir,target=$slot_dir" \
	--mount "type=bind,source=$cache_project,target=$cache_project" \
	--mount "type=bind,source=$status_dir,target=$status_dir"
# BERTH_HELPER is the berth binary, which the runner's scripts run as
# "<BERTH_HELPER> helper …" inside the environment, at the same path.
if [ -n "${BERTH_HELPER:-}" ]; then
	case $BERTH_HELPER in
	/* ) ;;
	*) fail_system "BERTH_HELPER $BERTH_HELPER: not an absolute path" ;;
	esac
	[ -f "$BERTH_HELPER" ] || fail_system "BERTH_HELPER $BERTH_HELPER: no such file"
	case $BERTH_HELPER in
	*,*) fail_system "BERTH_HELPER $BERTH_HELPER: a path with a comma cannot be mounted" ;;
	esac
	set -- "$@" --mount "type=bind,source=$BERTH_HELPER,target=$BERTH_HELPER,readonly"
fi

# --init: docker-init is PID 1 and reaps what the stages leave behind; the
# keep-alive loop carries no stage marker, so stages never kill it.
# shellcheck disable=SC2016 # runs in the container
docker run --detach --init --name "$container" --hostname "$container" \
	--label "$label=true" \
	--label "$label.dir=$base_dir" \
	--label "$label.runner=$runner" \
	--label "$label.job-id=$job" \
	--label "$label.project-id=${CUSTOM_ENV_CI_PROJECT_ID:-}" \
	--label "$label.pipeline-id=${CUSTOM_ENV_CI_PIPELINE_ID:-}" \
	"$@" \
	--entrypoint /bin/sh "$image" -c 'trap "exit 0" TERM; while :; do sleep 3600 & wait $!; done' >/dev/null ||
	fail_system "starting container $container failed"

running=$(docker inspect --format '{{.State.Running}}' "$container" 2>/dev/null) || running=false
[ "$running" = true ] || fail_system "container $container is not running after its start"
