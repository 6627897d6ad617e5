// Package reap finds and signals every process a job stage started, also
// those that left the stage's process group and session (setsid, double
// fork, daemons). Each stage runs with a marker variable in its
// environment (Env), which every descendant inherits; Signal scans /proc
// for processes whose initial environment holds it.
//
// The marker is a best effort bound, not a sandbox: a process that execs
// with a cleared environment loses it. Executors that need a hard bound
// use a container, a VM or a cgroup; the shell executor and the ssh
// executor's hosts use this.
package reap

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
)

// Variable is the environment variable that carries the marker.
const Variable = "BERTH_STAGE_MARKER"

// NewMarker returns a fresh random marker.
func NewMarker() string { return NewScopedMarker("") }

// NewScopedMarker returns a fresh random marker. A non-empty scope (for
// example a runner's system id and short token) is its prefix, so that
// SignalScope finds every stage of that scope, also those of a crashed
// predecessor process.
func NewScopedMarker(scope string) string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	if scope == "" {
		return hex.EncodeToString(b[:])
	}
	return scope + "." + hex.EncodeToString(b[:])
}

// SignalScope signals every process whose marker was made by
// NewScopedMarker with scope. The scope must be at least 8 characters: it
// decides which processes die.
func SignalScope(scope string, sig syscall.Signal) (int, error) {
	if len(scope) < 8 {
		return 0, fmt.Errorf("reap: scope %q is too short", scope)
	}
	return signal("/proc", []byte(Env(scope+".")), sig, true)
}

// Env is the environment entry that marks a stage's processes.
func Env(marker string) string { return Variable + "=" + marker }

// Signal sends sig to every process on this host (that the caller may
// signal) whose environment carries marker, except the caller itself, and
// returns how many it signalled. A marker shorter than 16 characters is
// refused: it could match processes of other stages.
func Signal(marker string, sig syscall.Signal) (int, error) {
	if len(marker) < 16 {
		return 0, fmt.Errorf("reap: marker %q is too short", marker)
	}
	return signal("/proc", []byte(Env(marker)), sig, false)
}

// SignalEnv signals every process (but the caller) whose environment has
// the entry name=value, and returns how many it signalled. value must be
// at least 16 characters long: it decides which processes die.
func SignalEnv(name, value string, sig syscall.Signal) (int, error) {
	if len(value) < 16 || name == "" {
		return 0, fmt.Errorf("reap: %s=%q is too short a mark", name, value)
	}
	return signal("/proc", []byte(name+"="+value), sig, false)
}

// signal signals the processes whose environment has the entry want
// (prefix: an entry starting with want).
func signal(procDir string, want []byte, sig syscall.Signal, prefix bool) (int, error) {
	entries, err := os.ReadDir(procDir)
	if err != nil {
		return 0, fmt.Errorf("reap: listing processes: %w", err)
	}
	self := os.Getpid()
	n := 0
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self || pid <= 1 {
			continue
		}
		env, err := os.ReadFile(procDir + "/" + e.Name() + "/environ")
		if err != nil {
			continue // gone, or not ours to read
		}
		if !hasEntry(env, want, prefix) {
			continue
		}
		if err := syscall.Kill(pid, sig); err == nil {
			n++
		} else if !errors.Is(err, syscall.ESRCH) {
			continue
		}
	}
	return n, nil
}

// hasEntry reports whether the NUL-separated environment block holds the
// entry want (prefix: an entry that starts with want).
func hasEntry(env, want []byte, prefix bool) bool {
	for len(env) > 0 {
		i := bytes.IndexByte(env, 0)
		entry := env
		if i >= 0 {
			entry, env = env[:i], env[i+1:]
		} else {
			env = nil
		}
		if bytes.Equal(entry, want) || prefix && bytes.HasPrefix(entry, want) {
			return true
		}
	}
	return false
}
