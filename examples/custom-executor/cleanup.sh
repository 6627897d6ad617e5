#!/bin/sh
# cleanup_exec: remove the job's container. Runs after every job, also
# when config.sh or prepare.sh failed; a container that is not there is
# fine. The builds and cache directories stay for the next job.
. "$(dirname "$0")/base.sh"

if docker container inspect "$container" >/dev/null 2>&1; then
	docker rm --force --volumes "$container" >/dev/null || fail_system "removing container $container failed"
	echo "removed container $container"
fi
rm -rf "$status_dir"
