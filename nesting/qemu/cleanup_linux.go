package qemu

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// leftover is a QEMU process of a VM directory under vms/ that no running
// hypervisor owns: an earlier daemon's.
type leftover struct {
	pid int
	dir string
}

// vmDirOf returns the VM directory whose agent port a command line
// names in its -chardev argument, when that directory is directly under
// vmsDir: only the QEMU of a VM made by this package has one. Any other
// command line (also one that merely mentions the directory, such as
// `tail console.log`) gives false.
func vmDirOf(args []string, vmsDir string) (string, bool) {
	for i := 0; i+1 < len(args); i++ {
		if args[i] != "-chardev" {
			continue
		}
		rest, ok := strings.CutPrefix(args[i+1], agentChardevPrefix)
		if !ok {
			continue
		}
		path, _, _ := strings.Cut(rest, ",")
		dir := filepath.Dir(path)
		if filepath.Base(path) == portFile && filepath.Dir(dir) == vmsDir && filepath.IsAbs(path) && filepath.Clean(path) == path {
			return dir, true
		}
	}
	return "", false
}

// readCmdline returns the arguments of process pid from procDir.
func readCmdline(procDir string, pid int) ([]string, error) {
	b, err := os.ReadFile(filepath.Join(procDir, strconv.Itoa(pid), "cmdline"))
	if err != nil {
		return nil, err
	}
	b = bytes.TrimSuffix(b, []byte{0})
	if len(b) == 0 {
		return nil, nil // a kernel thread or a zombie
	}
	return strings.Split(string(b), "\x00"), nil
}

// findLeftovers lists the processes in procDir (/proc) whose command line
// has the agent socket of a VM directory under vmsDir, except self.
func findLeftovers(procDir, vmsDir string, self int) ([]leftover, error) {
	entries, err := os.ReadDir(procDir)
	if err != nil {
		return nil, fmt.Errorf("listing processes: %w", err)
	}
	var out []leftover
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 || pid == self {
			continue
		}
		args, err := readCmdline(procDir, pid)
		if err != nil {
			continue // gone meanwhile, or not readable
		}
		if dir, ok := vmDirOf(args, vmsDir); ok {
			out = append(out, leftover{pid: pid, dir: dir})
		}
	}
	slices.SortFunc(out, func(a, b leftover) int { return a.pid - b.pid })
	return out, nil
}

// terminate stops leftover process l: SIGTERM, SIGKILL after grace, and
// waits until it exited. The process is pinned with a pidfd and its
// command line read again through it, so a pid that was reused by an
// unrelated process meanwhile is never signalled.
func terminate(procDir, vmsDir string, l leftover, grace time.Duration) error {
	fd, err := unix.PidfdOpen(l.pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil // gone
	}
	if err != nil {
		return fmt.Errorf("pidfd_open(%d): %w", l.pid, err)
	}
	defer unix.Close(fd)
	args, err := readCmdline(procDir, l.pid)
	if err != nil {
		return nil // gone
	}
	if dir, ok := vmDirOf(args, vmsDir); !ok || dir != l.dir {
		return nil // the pid is another process's now
	}
	for _, sig := range []unix.Signal{unix.SIGTERM, unix.SIGKILL} {
		if err := unix.PidfdSendSignal(fd, sig, nil, 0); err != nil {
			if errors.Is(err, unix.ESRCH) {
				return nil
			}
			return fmt.Errorf("signalling QEMU (pid %d) with %v: %w", l.pid, sig, err)
		}
		wait := grace
		if sig == unix.SIGKILL {
			wait = killWait
		}
		if exited, err := waitPidfd(fd, wait); err != nil {
			return fmt.Errorf("waiting for QEMU (pid %d): %w", l.pid, err)
		} else if exited {
			return nil
		}
	}
	return fmt.Errorf("QEMU (pid %d) still runs %v after SIGKILL", l.pid, killWait)
}

// waitPidfd waits until the process of pidfd fd exited (it becomes
// readable), at most d.
func waitPidfd(fd int, d time.Duration) (bool, error) {
	deadline := time.Now().Add(d)
	for {
		left := time.Until(deadline)
		if left < 0 {
			left = 0
		}
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, int(left.Milliseconds()))
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return false, err
		}
		if n > 0 {
			return true, nil
		}
		if left == 0 {
			return false, nil
		}
	}
}

// cleanLeftovers stops every QEMU of a VM directory under vmsDir and
// removes every entry of vmsDir: what an earlier daemon process left
// behind (it crashed, or the host rebooted). It runs with the state
// directory's lock held, so no live daemon owns any of it.
func (h *Hypervisor) cleanLeftovers(vmsDir string) error {
	procs, err := findLeftovers(h.procDir, vmsDir, os.Getpid())
	if err != nil {
		return err
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for _, l := range procs {
		wg.Go(func() {
			h.log.Warn("stopping the QEMU of a VM an earlier daemon left behind", "pid", l.pid, "dir", l.dir)
			if err := terminate(h.procDir, vmsDir, l, deleteGrace); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	entries, err := os.ReadDir(vmsDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	for _, e := range entries {
		p := filepath.Join(vmsDir, e.Name())
		h.log.Info("removing a VM directory an earlier daemon left behind", "dir", p)
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cleaning up VMs of an earlier daemon in %s: %w", vmsDir, err)
	}
	return nil
}
