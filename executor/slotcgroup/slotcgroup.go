// Package slotcgroup puts the jobs of an autoscaled instance's slots in
// cgroups, and limits, kills and watches them there.
//
// # Model
//
// An autoscaled instance runs up to capacity_per_instance jobs at once, each
// in a numbered slot (0 … capacity_per_instance-1, from taskscaler). With
// GitLab's keys use_slot_cgroups = true and slot_cgroup_template (default
// DefaultTemplate), a slot's jobs belong to the cgroup the template names
// for that slot: Expand turns template and slot into a relative cgroup path
// such as "gitlab-runner/slot-3", the same path in every hierarchy under the
// cgroup root of the instance (/sys/fs/cgroup). Docker executors pass it as
// the containers' --cgroup-parent; shell-like executors move each stage's
// shell into it (EnterScript).
//
// GitLab creates nothing there and sets no limits: an administrator has to
// prepare the cgroups in the instance image. Berth manages them itself:
//
//	SetupScript     create the slot cgroup (v1: cpu, cpuacct, memory, pids and
//	     │          freezer hierarchies, each when mounted; v2: the unified
//	     │          hierarchy, controllers enabled in every ancestor) and write
//	     │          the Limits, resetting the ones that are zero
//	     ▼
//	OOMKillsScript  read the OOM kill count before the job
//	     │
//	EnterScript     prepended to every stage's script: the stage's shell, and
//	     │          so everything it starts, runs in the slot cgroup
//	     ▼
//	OOMKillsScript  read it again: a higher count means the job exceeded its
//	     │          memory limit
//	KillScript      from outside the cgroup, when the job ends or is canceled:
//	     │          kills every process in it and waits until it is empty,
//	     │          also those that left the stage's process group (setsid,
//	     │          daemons) and those in child cgroups (containers)
//	     ▼
//	RemoveScript    remove the slot cgroup (optional: the next job of the slot
//	                runs SetupScript again, which is idempotent)
//
// The instance is usually remote, so the package's product is POSIX sh
// scripts, run as root on the instance with /bin/sh -c (dash, busybox ash
// and bash all do), using nothing but sh built-ins, cat, mkdir, rmdir and
// sleep. Each script finds out at run time whether the instance has cgroup
// v2 (<root>/cgroup.controllers exists) or v1 (<root>/<controller>/ are the
// hierarchies; a hybrid host's empty <root>/unified is ignored), with <root>
// taken from the environment variable BERTH_CGROUP_ROOT, default
// /sys/fs/cgroup. Scripts print nothing on success (OOMKillsScript prints
// its count); on failure they print one line naming the file to stderr and
// exit 1. They may be joined into one script (KillScript + "\n" +
// OOMKillsScript): none exits on success, none reads standard input (so
// they can be fed to sh -s), and each sets everything it uses itself.
// Detect answers the same question for the local machine.
//
// Limits only apply when Docker uses its cgroupfs driver (or no Docker is
// involved): with the systemd driver the template names a slice
// ("runner-slot-${slot}.slice"), and limits belong to the slice's unit.
package slotcgroup

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	units "github.com/docker/go-units"
)

// DefaultTemplate is GitLab's slot_cgroup_template default.
const DefaultTemplate = "gitlab-runner/slot-${slot}"

// Limits are Berth's per-slot limits ([runners.slot_cgroup] in config.toml).
// Zero values mean no limit; SetupScript then resets the corresponding
// cgroup file to unlimited, so a slot reused with other limits does not keep
// old ones.
type Limits struct {
	// CPUs is a decimal number of CPUs ("1.5", at least 0.01): a CFS quota
	// per 100 ms period (v2 cpu.max "150000 100000"; v1 cpu.cfs_quota_us
	// 150000, cpu.cfs_period_us 100000).
	CPUs string `toml:"cpus"`
	// Memory is a Docker-style size ("512m", "2g", "1048576" bytes; at least
	// 6m): v2 memory.max (and memory.swap.max 0 where it exists), v1
	// memory.limit_in_bytes (and memory.memsw.limit_in_bytes to the same
	// value where it exists), so swap does not dodge the limit.
	Memory string `toml:"memory"`
	// Pids is the most processes and threads the slot may have at once (v1
	// and v2 pids.max); at most 4194304, the kernel's maximum.
	Pids int64 `toml:"pids"`
}

// cfsPeriod is the CFS period the CPU limit uses, in microseconds.
const cfsPeriod = 100000

// maxPids is the largest value pids.max accepts (PID_MAX_LIMIT).
const maxPids = 4 << 20

// cpusRE is a plain decimal number: digits with an optional fraction.
var cpusRE = regexp.MustCompile(`^(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)$`)

// IsZero reports whether l sets no limit at all.
func (l Limits) IsZero() bool {
	return strings.TrimSpace(l.CPUs) == "" && strings.TrimSpace(l.Memory) == "" && l.Pids == 0
}

// Validate checks every limit; each error names its key ("cpus: …",
// "memory: …", "pids: …"), and all of them are reported together.
func (l Limits) Validate() error {
	var errs []error
	if _, err := l.cfsQuota(); err != nil {
		errs = append(errs, err)
	}
	if _, err := l.memoryBytes(); err != nil {
		errs = append(errs, err)
	}
	if _, err := l.pids(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// cfsQuota returns the CFS quota in microseconds per cfsPeriod (0: no
// limit).
func (l Limits) cfsQuota() (int64, error) {
	v := strings.TrimSpace(l.CPUs)
	if v == "" {
		return 0, nil
	}
	if !cpusRE.MatchString(v) {
		return 0, fmt.Errorf("cpus: %q is not a decimal number of CPUs (like 1.5)", l.CPUs)
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsInf(f, 0) {
		return 0, fmt.Errorf("cpus: %q is not a decimal number of CPUs (like 1.5)", l.CPUs)
	}
	if f > 1e6 {
		return 0, fmt.Errorf("cpus: %q: must be at most 1000000", l.CPUs)
	}
	q := int64(math.Round(f * cfsPeriod))
	if q < cfsPeriod/100 {
		return 0, fmt.Errorf("cpus: %q: must be at least 0.01", l.CPUs)
	}
	return q, nil
}

// memoryBytes returns the memory limit in bytes (0: no limit).
func (l Limits) memoryBytes() (int64, error) {
	v := strings.TrimSpace(l.Memory)
	if v == "" {
		return 0, nil
	}
	n, err := units.RAMInBytes(v)
	if err != nil {
		return 0, fmt.Errorf("memory: %q is not a size (like 512m or 2g)", l.Memory)
	}
	if n < 6<<20 {
		return 0, fmt.Errorf("memory: %q: must be at least 6m", l.Memory)
	}
	return n, nil
}

// pids returns the pids limit (0: no limit).
func (l Limits) pids() (int64, error) {
	switch {
	case l.Pids < 0:
		return 0, fmt.Errorf("pids: %d: must not be negative (0 means no limit)", l.Pids)
	case l.Pids > maxPids:
		return 0, fmt.Errorf("pids: %d: must be at most %d, the kernel's maximum", l.Pids, maxPids)
	}
	return l.Pids, nil
}

// Expand expands template for slot with GitLab's rules: os.Expand where only
// "slot" is known, so ${slot} and $slot both become the slot number and any
// other $NAME (or ${NAME}) becomes empty. The result is a relative cgroup
// path; Expand returns an error when slot is negative (the job has no slot)
// or when the result is empty, absolute, has ".", ".." or empty elements
// (a//b, a trailing slash) or characters outside [A-Za-z0-9._/@:+=-], so it
// is safe in a shell script and as Docker's cgroup parent.
//
// A template without the placeholder is not an error (GitLab only warns:
// every slot then shares one cgroup); callers warn with HasPlaceholder.
func Expand(template string, slot int) (string, error) {
	if slot < 0 {
		return "", fmt.Errorf("slot cgroup template %q: slot %d: the job has no slot", template, slot)
	}
	p := os.Expand(template, func(name string) string {
		if name == "slot" {
			return strconv.Itoa(slot)
		}
		return ""
	})
	if err := checkPath(p); err != nil {
		return "", fmt.Errorf("slot cgroup template %q: %w", template, err)
	}
	return p, nil
}

// HasPlaceholder reports whether template refers to the slot (${slot} or
// $slot), that is whether different slots get different cgroups.
func HasPlaceholder(template string) bool {
	found := false
	os.Expand(template, func(name string) string {
		if name == "slot" {
			found = true
		}
		return ""
	})
	return found
}

// checkPath checks an expanded template (see Expand).
func checkPath(p string) error {
	if p == "" {
		return errors.New("expands to an empty path")
	}
	if strings.HasPrefix(p, "/") {
		return fmt.Errorf("expands to %q, an absolute path (cgroup paths are relative to the cgroup root)", p)
	}
	for _, r := range p {
		if !pathChar(r) {
			return fmt.Errorf("expands to %q, which has %q (allowed: A-Z a-z 0-9 . _ / @ : + = -)", p, r)
		}
	}
	for _, e := range strings.Split(p, "/") {
		switch e {
		case "":
			return fmt.Errorf("expands to %q, which has an empty path element", p)
		case ".", "..":
			return fmt.Errorf("expands to %q, which has a %q path element", p, e)
		}
	}
	return nil
}

func pathChar(r rune) bool {
	switch {
	case 'a' <= r && r <= 'z', 'A' <= r && r <= 'Z', '0' <= r && r <= '9':
		return true
	}
	return strings.ContainsRune("._/@:+=-", r)
}

// Version is the cgroup version of a host.
type Version int

const (
	// Unsupported: neither a cgroup v2 root nor the v1 memory or pids
	// hierarchy was found.
	Unsupported Version = iota
	// V1 is the legacy hierarchy (one mount per controller); hybrid hosts,
	// with v1 controllers and an empty v2 mount at <root>/unified, are V1.
	V1
	// V2 is the unified hierarchy.
	V2
)

// String returns "unsupported", "v1" or "v2".
func (v Version) String() string {
	switch v {
	case V1:
		return "v1"
	case V2:
		return "v2"
	}
	return "unsupported"
}

// Detect returns the cgroup version of this host, for callers that run the
// scripts locally (the shell executor); the scripts make the same decision
// themselves. root is the cgroup root ("" means /sys/fs/cgroup). It is V2
// when <root>/cgroup.controllers exists, V1 when <root>/memory or
// <root>/pids is a directory (a symbolic link to one counts), and
// Unsupported otherwise.
func Detect(root string) Version {
	if root == "" {
		root = "/sys/fs/cgroup"
	}
	if fi, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err == nil && fi.Mode().IsRegular() {
		return V2
	}
	for _, c := range []string{"memory", "pids"} {
		if fi, err := os.Stat(filepath.Join(root, c)); err == nil && fi.IsDir() {
			return V1
		}
	}
	return Unsupported
}
