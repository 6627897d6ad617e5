#!/bin/sh
# config_exec: tell the runner where the job's directories are. The
# builds directory is shared by the jobs of the host (builds_dir_is_shared),
# so each job gets <builds>/<runner>/<concurrency id>/<project>.
. "$(dirname "$0")/base.sh"

cat <<JSON
{
  "builds_dir": "$builds_dir",
  "cache_dir": "$cache_dir",
  "builds_dir_is_shared": true,
  "hostname": "$container",
  "driver": {"name": "$driver_name", "version": "$driver_version"}
}
JSON
