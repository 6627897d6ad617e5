package slotcgroup

import (
	"strconv"
	"strings"
)

// The scripts are built from the shell fragments below. Every name a script
// defines starts with berth_ so that a script prepended to a job's stage
// (EnterScript, which also runs in a subshell) cannot clash with the job's
// variables. Conventions the fragments rely on:
//
//   - $berth_root is the cgroup root, $berth_path the slot's relative path.
//   - Files are written with berth_write FILE VALUE: one write(2) of
//     "VALUE\n" by cat, which, unlike the shells' built-ins, reports the
//     kernel's error ("cat: write error: Invalid argument"). The file is
//     created when it does not exist, as echo VALUE > FILE does, which is
//     what a fake tree needs; cgroupfs never lets a write create a file,
//     so a missing controller file is an error there.
//   - berth_fail prints "berth: slot cgroup <path>: <message>" to stderr
//     and exits 1 (the subshell only, inside a subshell function).

// v1Controllers are the v1 hierarchies a slot cgroup is created in and a
// stage enters, each when <root>/<name> exists: the cpu and cpuacct
// controllers are often one joint mount ("cpu,cpuacct", with symbolic links
// cpu and cpuacct to it), so both spellings are listed; doing the same thing
// twice through a link is harmless.
const v1Controllers = "cpu cpuacct cpu,cpuacct cpuacct,cpu memory pids freezer"

// isV2 is the shell test for a cgroup v2 root.
const isV2 = `[ -f "$berth_root/cgroup.controllers" ]`

const fragFail = `berth_fail() {
	printf '%s\n' "berth: slot cgroup $berth_path: $*" >&2
	exit 1
}
`

const fragWrite = `berth_try() {
	berth_err=$( { printf '%s\n' "$2" | cat > "$1"; } 2>&1 )
}
berth_write() {
	berth_try "$1" "$2" || berth_fail "writing \"$2\" to $1: ${berth_err:-write failed}"
}
`

// fragPause sleeps a tenth of a second (a second where sleep only takes
// integers, as POSIX's) and counts the time waited in $berth_waited, in
// tenths of a second.
const fragPause = `berth_waited=0
berth_pause() {
	if sleep 0.1 2>/dev/null; then
		berth_waited=$((berth_waited + 1))
	else
		sleep 1
		berth_waited=$((berth_waited + 10))
	fi
}
`

// fragEach runs a command with every existing slot directory as its last
// argument: the v2 one, or on v1 the one of every hierarchy under the root
// (not only the controllers SetupScript uses: a container runtime given the
// slot as cgroup parent creates it in all of them). It fails when one of the
// commands does.
const fragEach = `berth_each() {
	berth_rc=0
	if ` + isV2 + `; then
		if [ -d "$berth_root/$berth_path" ]; then "$@" "$berth_root/$berth_path" || berth_rc=1; fi
	else
		for berth_h in "$berth_root"/*/; do
			if [ -d "$berth_h$berth_path" ]; then "$@" "$berth_h$berth_path" || berth_rc=1; fi
		done
	fi
	return $berth_rc
}
`

// fragProcs prints the processes of a cgroup and of its descendants.
const fragProcs = `berth_procs() (
	cat "$1/cgroup.procs" 2>/dev/null
	for berth_c in "$1"/*/; do
		[ ! -d "$berth_c" ] || berth_procs "${berth_c%/}"
	done
)
`

// shq quotes s for a POSIX shell: one single-quoted word.
func shq(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// prelude starts every script: default IFS, the root and the path. A path
// that is empty or has an empty, "." or ".." element would name the root
// itself or leave it (KillScript would then kill every process of the
// host): the script fails at once instead.
func prelude(path string) string {
	for _, e := range strings.Split(path, "/") {
		if e == "" || e == "." || e == ".." {
			return "berth_path=" + shq(path) + "\n" + fragFail +
				"berth_fail 'not a relative cgroup path (empty, \".\" or \"..\" element)'\n"
		}
	}
	return "IFS=' \t\n'\n" +
		"berth_root=${BERTH_CGROUP_ROOT:-/sys/fs/cgroup}\n" +
		"berth_path=" + shq(path) + "\n"
}

// SetupScript returns a script that creates the slot cgroup at path and
// applies l. It is idempotent and meant to run before every job of the slot.
//
// In all scripts, path is an Expand result: the scripts quote it and do not
// check it again, except that a path that is empty or has an empty, "." or
// ".." element (it would name the cgroup root or leave it) makes the script
// fail at once.
//
// On cgroup v1 it creates the cgroup in the cpu, cpuacct, memory, pids and
// freezer hierarchies that are mounted (freezer is what KillScript uses).
// On v2 it walks from the root down to the slot's parent, enabling cpu,
// memory and pids in each cgroup.subtree_control where cgroup.controllers
// offers them and they are not enabled yet, and creates the missing levels;
// the slot itself gets no subtree controllers, so processes may live in it.
//
// Then it writes every limit of l, and resets every zero limit whose file
// exists to unlimited ("max", or -1 on v1), so a slot reused with other
// limits keeps no old ones. A limit whose controller is missing fails the
// script. An l that does not pass Validate gives a script that fails with
// Validate's message.
func SetupScript(path string, l Limits) string {
	var b strings.Builder
	b.WriteString(prelude(path))
	b.WriteString(fragFail)
	if err := l.Validate(); err != nil {
		msg := strings.ReplaceAll(err.Error(), "\n", "; ")
		b.WriteString("berth_fail " + shq("invalid limits: "+msg) + "\n")
		return b.String()
	}
	quota, _ := l.cfsQuota()
	mem, _ := l.memoryBytes()
	pids, _ := l.pids()

	b.WriteString(fragWrite)
	b.WriteString(`berth_maybe() {
	[ ! -f "$1" ] || berth_write "$1" "$2"
}
berth_mkdir() {
	[ ! -d "$1" ] || return 0
	berth_err=$(mkdir -p "$1" 2>&1) || berth_fail "creating $1: $berth_err"
}
berth_enable() {
	[ -f "$1/cgroup.controllers" ] || return 0
	berth_want=
	for berth_c in $(cat "$1/cgroup.controllers"); do
		case $berth_c in cpu|memory|pids) ;; *) continue ;; esac
		berth_on=
		if [ -f "$1/cgroup.subtree_control" ]; then
			for berth_x in $(cat "$1/cgroup.subtree_control"); do
				[ "$berth_x" != "$berth_c" ] || berth_on=1
			done
		fi
		[ -n "$berth_on" ] || berth_want="$berth_want +$berth_c"
	done
	[ -z "$berth_want" ] || berth_write "$1/cgroup.subtree_control" "${berth_want# }"
}
if ` + isV2 + `; then
	berth_d=$berth_root
	berth_rest=$berth_path
	while [ -n "$berth_rest" ]; do
		berth_enable "$berth_d"
		case $berth_rest in
		*/*) berth_d=$berth_d/${berth_rest%%/*}; berth_rest=${berth_rest#*/} ;;
		*) berth_d=$berth_d/$berth_rest; berth_rest= ;;
		esac
		berth_mkdir "$berth_d"
	done
`)
	// v2 limits, in the slot directory $berth_d.
	if quota > 0 {
		b.WriteString("\tberth_write \"$berth_d/cpu.max\" " + shq(itoa(quota)+" "+itoa(cfsPeriod)) + "\n")
	} else {
		b.WriteString("\tberth_maybe \"$berth_d/cpu.max\" " + shq("max "+itoa(cfsPeriod)) + "\n")
	}
	if mem > 0 {
		b.WriteString("\tberth_write \"$berth_d/memory.max\" " + itoa(mem) + "\n")
		b.WriteString("\tberth_maybe \"$berth_d/memory.swap.max\" 0\n")
	} else {
		b.WriteString("\tberth_maybe \"$berth_d/memory.max\" max\n")
		b.WriteString("\tberth_maybe \"$berth_d/memory.swap.max\" max\n")
	}
	if pids > 0 {
		b.WriteString("\tberth_write \"$berth_d/pids.max\" " + itoa(pids) + "\n")
	} else {
		b.WriteString("\tberth_maybe \"$berth_d/pids.max\" max\n")
	}

	b.WriteString(`else
	berth_n=0
	for berth_c in ` + v1Controllers + `; do
		[ -d "$berth_root/$berth_c" ] || continue
		berth_mkdir "$berth_root/$berth_c/$berth_path"
		berth_n=1
	done
	[ "$berth_n" = 1 ] || berth_fail "no cgroup hierarchy under $berth_root (neither cgroup v2's cgroup.controllers nor a cgroup v1 cpu, memory, pids or freezer directory)"
	berth_cpu=
	for berth_c in cpu cpu,cpuacct cpuacct,cpu; do
		if [ -d "$berth_root/$berth_c" ]; then berth_cpu=$berth_root/$berth_c/$berth_path; break; fi
	done
	berth_mem=$berth_root/memory/$berth_path
	berth_pids=$berth_root/pids/$berth_path
`)
	// v1 limits.
	if quota > 0 {
		b.WriteString(`	[ -n "$berth_cpu" ] || berth_fail "cpus: no cgroup v1 cpu hierarchy under $berth_root"
	berth_write "$berth_cpu/cpu.cfs_period_us" ` + itoa(cfsPeriod) + `
	berth_write "$berth_cpu/cpu.cfs_quota_us" ` + itoa(quota) + "\n")
	} else {
		b.WriteString("\t[ -z \"$berth_cpu\" ] || berth_maybe \"$berth_cpu/cpu.cfs_quota_us\" -1\n")
	}
	// memsw must stay >= the memory limit: lift it first, set the limit,
	// then lower it to the limit.
	if mem > 0 {
		b.WriteString(`	[ -d "$berth_root/memory" ] || berth_fail "memory: no cgroup v1 memory hierarchy under $berth_root"
	berth_maybe "$berth_mem/memory.memsw.limit_in_bytes" -1
	berth_write "$berth_mem/memory.limit_in_bytes" ` + itoa(mem) + `
	berth_maybe "$berth_mem/memory.memsw.limit_in_bytes" ` + itoa(mem) + "\n")
	} else {
		b.WriteString(`	berth_maybe "$berth_mem/memory.memsw.limit_in_bytes" -1
	berth_maybe "$berth_mem/memory.limit_in_bytes" -1
`)
	}
	if pids > 0 {
		b.WriteString(`	[ -d "$berth_root/pids" ] || berth_fail "pids: no cgroup v1 pids hierarchy under $berth_root"
	berth_write "$berth_pids/pids.max" ` + itoa(pids) + "\n")
	} else {
		b.WriteString("\tberth_maybe \"$berth_pids/pids.max\" max\n")
	}
	b.WriteString("fi\n")
	return b.String()
}

// EnterScript returns a script that moves the shell running it ($$) into
// the slot cgroup at path: on v1 into every hierarchy SetupScript creates it
// in, on v2 into the unified one. It is meant to be prepended to a stage's
// script, so that every process of the stage starts inside; it runs in a
// subshell (which leaves no variables behind and moves $$, not itself) and,
// when the move fails, prints why and exits the stage's shell with status 1
// rather than running the job unconfined.
func EnterScript(path string) string {
	return "(\n" + prelude(path) + fragFail + fragWrite + `if ` + isV2 + `; then
	berth_write "$berth_root/$berth_path/cgroup.procs" $$
else
	berth_n=0
	for berth_c in ` + v1Controllers + `; do
		[ -d "$berth_root/$berth_c" ] || continue
		berth_write "$berth_root/$berth_c/$berth_path/cgroup.procs" $$
		berth_n=1
	done
	[ "$berth_n" = 1 ] || berth_fail "no cgroup hierarchy under $berth_root"
fi
) || exit 1
`
}

// KillScript returns a script that kills every process in the slot cgroup
// at path and in its descendants (containers), and waits until they are
// gone, for at most about 10 s; processes still there then make it fail.
// A cgroup that does not exist is nothing to do (exit 0).
//
// On v2 it writes cgroup.kill where the kernel has it (5.14); on v1 it
// freezes the freezer cgroup, sends SIGKILL to every process and thaws it,
// so nothing can fork in between; then, and everywhere else, it sends
// SIGKILL to whatever is left, every tenth of a second, until nothing is.
//
// Callers run it from outside the cgroup. It never kills its own shell
// ($$), and skips freezing when its shell is inside, but the processes it
// starts itself (command substitutions) would be killed there.
func KillScript(path string) string {
	return prelude(path) + fragFail + fragWrite + fragPause + fragEach + fragProcs + `berth_kill() {
	for berth_pid in $(berth_each berth_procs); do
		case $berth_pid in ''|0|*[!0-9]*) continue ;; esac
		[ "$berth_pid" != "$$" ] || continue
		if kill -9 "$berth_pid" 2>/dev/null; then echo "$berth_pid"; fi
	done
}
if ` + isV2 + `; then
	if [ -f "$berth_root/$berth_path/cgroup.kill" ]; then
		berth_try "$berth_root/$berth_path/cgroup.kill" 1 || :
	fi
elif [ -d "$berth_root/freezer/$berth_path" ]; then
	berth_fz=$berth_root/freezer/$berth_path
	berth_self=
	for berth_pid in $(berth_procs "$berth_fz"); do
		[ "$berth_pid" != "$$" ] || berth_self=1
	done
	if [ -z "$berth_self" ] && berth_try "$berth_fz/freezer.state" FROZEN; then
		while [ "$(cat "$berth_fz/freezer.state" 2>/dev/null)" != FROZEN ] && [ "$berth_waited" -lt 50 ]; do
			berth_pause
		done
		berth_kill >/dev/null
		berth_write "$berth_fz/freezer.state" THAWED
	fi
fi
while :; do
	berth_left=$(berth_kill)
	[ -n "$berth_left" ] || break
	[ "$berth_waited" -lt 100 ] || berth_fail "processes still in the cgroup after 10 s:" $berth_left
	berth_pause
done
`
}

// OOMKillsScript returns a script that prints one integer: how many
// processes the kernel's OOM killer has killed in the slot cgroup at path so
// far (0 when the cgroup or the counter does not exist). On v2 it reads
// "oom_kill N" from the slot's memory.events, which counts descendants too;
// on v1 it sums "oom_kill N" of memory.oom_control (kernel 4.13 or later)
// over the slot and its descendants. Callers read it before and after a job:
// a higher count means the job exceeded its memory limit.
func OOMKillsScript(path string) string {
	return prelude(path) + `berth_count() {
	[ -f "$1" ] || return 0
	while read -r berth_k berth_v || [ -n "$berth_k" ]; do
		[ "$berth_k" != oom_kill ] || echo "$berth_v"
	done < "$1"
}
berth_tree() (
	berth_count "$1/memory.oom_control"
	for berth_c in "$1"/*/; do
		[ ! -d "$berth_c" ] || berth_tree "${berth_c%/}"
	done
)
if ` + isV2 + `; then
	berth_list=$(berth_count "$berth_root/$berth_path/memory.events")
else
	berth_list=$(berth_tree "$berth_root/memory/$berth_path")
fi
berth_n=0
for berth_v in $berth_list; do
	case $berth_v in ''|*[!0-9]*) continue ;; esac
	berth_n=$((berth_n + berth_v))
done
echo "$berth_n"
`
}

// RemoveScript returns a script that removes the slot cgroup at path, with
// its descendants first, from every hierarchy that has it (on v1 also those
// SetupScript does not use, where a container runtime may have created
// it); absent ones are fine. Run it after KillScript: a cgroup that stays
// busy for 2 s makes it fail, naming the directory.
func RemoveScript(path string) string {
	return prelude(path) + fragFail + fragPause + fragEach + `berth_rm() (
	for berth_c in "$1"/*/; do
		[ ! -d "$berth_c" ] || berth_rm "${berth_c%/}" || exit 1
	done
	until berth_err=$(rmdir "$1" 2>&1); do
		[ -d "$1" ] || exit 0
		[ "$berth_waited" -lt 20 ] || berth_fail "removing $1: $berth_err"
		berth_pause
	done
)
berth_each berth_rm || exit 1
`
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
