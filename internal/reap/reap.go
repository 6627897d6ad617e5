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
	"io"
	"os"
	"strconv"
	"syscall"
	"time"
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
	var r EnvironReader
	n := 0
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self || pid <= 1 {
			continue
		}
		env, err := r.Read(procDir + "/" + e.Name())
		if err != nil {
			continue // gone, or not ours to read
		}
		if !HasEntry(env, want, prefix) {
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

// execWindow bounds how long readEnviron waits for a process in the
// middle of an execve to show its environment again.
const execWindow = 50 * time.Millisecond

// EnvironReader reads processes' environment blocks for one scan of /proc,
// reusing its buffer. Its zero value is ready; it is not safe for
// concurrent use.
type EnvironReader struct{ buf []byte }

// Read reads the environment block of the process whose /proc directory
// is dir. Two states of an execve must not hide a process's marker:
//   - The kernel serves each read(2) of environ from the memory image it
//     holds at that call; a read in pieces (as os.ReadFile's first 512
//     bytes) whose next piece comes after the exec gets end of file, and
//     the block ends early. So the block is read in one call into a buffer
//     larger than it, grown and read again from the start if it is not.
//   - Between swapping in the new image and recording where its
//     environment lies the block reads empty. An empty block of a process
//     that is neither a kernel thread nor a zombie (which have none for
//     good) is read again until it shows or execWindow passes.
func (r *EnvironReader) Read(dir string) ([]byte, error) {
	env, err := r.readOnce(dir)
	if err != nil || len(env) > 0 {
		return env, err
	}
	for deadline := time.Now().Add(execWindow); mayBeExecing(dir) && time.Now().Before(deadline); {
		time.Sleep(200 * time.Microsecond)
		if env, err = r.readOnce(dir); err != nil || len(env) > 0 {
			return env, err
		}
	}
	return env, nil
}

// readOnce reads dir's environ in a single read(2).
func (r *EnvironReader) readOnce(dir string) ([]byte, error) {
	if r.buf == nil {
		r.buf = make([]byte, 64<<10)
	}
	for {
		f, err := os.Open(dir + "/environ")
		if err != nil {
			return nil, err
		}
		n, err := f.Read(r.buf)
		f.Close()
		if err == io.EOF {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		if n < len(r.buf) {
			return r.buf[:n], nil
		}
		// The block may be larger than the buffer (its bound is the
		// kernel's ARG_MAX, a quarter of the stack limit).
		r.buf = make([]byte, 2*len(r.buf))
	}
}

// pfKthread is the kernel's PF_KTHREAD process flag.
const pfKthread = 0x00200000

// mayBeExecing reports whether the process of /proc directory dir is one
// whose empty environment may be the passing state of an execve: it is
// alive and not a kernel thread, as its stat file says.
func mayBeExecing(dir string) bool {
	stat, err := os.ReadFile(dir + "/stat")
	if err != nil {
		return false
	}
	// pid (comm) state ppid pgrp session tty_nr tpgid flags ...; comm may
	// hold spaces and parentheses, so fields start after the last ')'.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return false
	}
	f := bytes.Fields(stat[i+1:])
	if len(f) < 7 {
		return false
	}
	switch string(f[0]) {
	case "Z", "X", "x":
		return false
	}
	flags, err := strconv.ParseUint(string(f[6]), 10, 64)
	return err == nil && flags&pfKthread == 0
}

// HasEntry reports whether the NUL-separated environment block holds the
// entry want (prefix: an entry that starts with want).
func HasEntry(env, want []byte, prefix bool) bool {
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
