package docker

// The shell programs the executor runs inside job containers. They are
// POSIX sh and use only builtins, kill, grep -z (or tr and grep, or bash's
// read -d '' when the image has neither) and, for the service health
// check, bash's /dev/tcp or nc.

// ANSI colours of the job log, as gitlab-runner prints them.
const (
	ansiYellow = "\x1b[0;33m"
	ansiRed    = "\x1b[31;1m"
	ansiReset  = "\x1b[0;m"
)

// shellCandidates are the shells looked for in a job image, in GitLab's
// order; sh first when the runner's shell is sh.
var (
	bashFirst = []string{"/usr/local/bin/bash", "/usr/bin/bash", "/bin/bash", "/usr/local/bin/sh", "/usr/bin/sh", "/bin/sh", "/busybox/sh"}
	shFirst   = []string{"/usr/local/bin/sh", "/usr/bin/sh", "/bin/sh", "/busybox/sh", "/usr/local/bin/bash", "/usr/bin/bash", "/bin/bash"}
)

// keepaliveCmd is the build container's command (after the image's
// entrypoint, if any): an interactive shell reading its standard input,
// which the container keeps open and nobody writes to. It needs no sleep
// binary and does nothing until the container is removed.
var keepaliveCmd = []string{"sh"}

// setupScript prepares a job's directories as root and prints the shell
// stages run with. Arguments: build dir, tmp dir, cache dir ("" for none),
// user to own them ("" when stages run as root), builds root, then the
// shell candidates.
const setupScript = `set -e
b=$1 t=$2 c=$3 u=$4 r=$5
shift 5
found=
for s in "$@"; do
	if [ -x "$s" ]; then found=$s; break; fi
done
if [ -z "$found" ]; then
	echo "shell not found (looked for $*)" >&2
	exit 3
fi
mkdir -p "$b" "$t"
if [ -n "$c" ]; then mkdir -p "$c"; fi
chmod 700 "$t"
if [ -n "$u" ]; then
	d=$b
	while [ -n "$d" ] && [ "$d" != "$r" ] && [ "$d" != / ]; do
		chown "$u" "$d"
		d=${d%/*}
	done
	chown "$u" "$t"
	if [ -n "$c" ]; then chown "$u" "$c"; fi
fi
echo "shell=$found"
`

// reapFunctions define _berth_reap SIGNAL MARKER: it signals every
// process of the container whose environment holds the stage marker
// (package reap's variable), except PID 1 and itself; with KILL it
// repeats until no such process is left, so that processes forked while
// it scans go too.
const reapFunctions = `_berth_grep=
if printf 'x\0' | grep -qzxF x 2>/dev/null; then
	_berth_grep=z
elif command -v grep >/dev/null 2>&1 && command -v tr >/dev/null 2>&1; then
	_berth_grep=tr
fi
_berth_has() {
	case $_berth_grep in
	z) grep -qzxF -- "$1" "$2" ;;
	tr) tr '\0' '\n' <"$2" | grep -qxF -- "$1" ;;
	*)
		[ -n "${BASH_VERSION-}" ] || return 1
		while IFS= read -r -d '' _berth_e; do
			[ "$_berth_e" = "$1" ] && return 0
		done <"$2"
		return 1
		;;
	esac
} 2>/dev/null
_berth_reap() {
	_berth_w="BERTH_STAGE_MARKER=$2"
	_berth_i=0
	while :; do
		_berth_n=0
		for _berth_d in /proc/[0-9]*; do
			_berth_p=${_berth_d#/proc/}
			if [ "$_berth_p" = 1 ] || [ "$_berth_p" = "$$" ]; then continue; fi
			if _berth_has "$_berth_w" "$_berth_d/environ"; then
				if kill -s "$1" "$_berth_p" 2>/dev/null; then _berth_n=$((_berth_n + 1)); fi
			fi
		done
		if [ "$1" != KILL ] || [ "$_berth_n" -eq 0 ] || [ "$_berth_i" -ge 100 ]; then break; fi
		_berth_i=$((_berth_i + 1))
	done
}
`

// reapScript is run as root to signal a stage's processes. Arguments:
// signal name (TERM, KILL), marker.
const reapScript = reapFunctions + `_berth_reap "$1" "$2"
`

// stageScript runs one stage. It is the exec's main process and does not
// carry the marker itself: it writes the script file from
// BERTH_STAGE_SCRIPT when the executor passed the script that way (small
// scripts: one API call less than copying the file), runs it with the
// marker in its environment, then kills whatever the script left behind
// (so a background process holding the output cannot hang the stage),
// removes the script file and exits with the script's status. Arguments:
// marker, script path, shell path, working directory.
const stageScript = reapFunctions + `_berth_m=$1 _berth_s=$2 _berth_sh=$3
if [ -n "${BERTH_STAGE_SCRIPT+set}" ]; then
	(umask 077 && printf '%s' "$BERTH_STAGE_SCRIPT" >"$_berth_s") || exit 1
	unset BERTH_STAGE_SCRIPT
fi
cd "$4" 2>/dev/null || cd /
case ${_berth_sh##*/} in
bash) BERTH_STAGE_MARKER=$_berth_m "$_berth_sh" --noprofile --norc "$_berth_s" </dev/null ;;
*) BERTH_STAGE_MARKER=$_berth_m "$_berth_sh" "$_berth_s" </dev/null ;;
esac
_berth_rc=$?
_berth_reap KILL "$_berth_m"
rm -f "$_berth_s"
exit "$_berth_rc"
`

// probeScript waits until TCP ports accept connections, from inside the
// job's network. Arguments: targets "id/host/port"; it prints "up <target>"
// for each as it opens and exits once all are up. It prints "no-probe" and
// exits 3 when the image has neither bash nor nc.
const probeScript = `_berth_try() {
	if [ -n "${BASH_VERSION-}" ]; then
		(exec 3<>"/dev/tcp/$1/$2") 2>/dev/null
		return
	fi
	nc -w 2 "$1" "$2" </dev/null >/dev/null 2>&1
}
if [ -z "${BASH_VERSION-}" ] && ! command -v nc >/dev/null 2>&1; then
	echo no-probe
	exit 3
fi
pending="$*"
while [ -n "$pending" ]; do
	next=
	for t in $pending; do
		rest=${t#*/}
		if _berth_try "${rest%/*}" "${rest##*/}"; then
			echo "up $t"
		else
			next="$next $t"
		fi
	done
	pending=${next# }
	if [ -n "$pending" ]; then sleep 0.2 2>/dev/null || sleep 1; fi
done
`
