package helper

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/berthci/berth/internal/reap"
)

// ReapOptions name the processes Reap signals: those whose environment
// carries the stage marker Marker (reap.Env), or any marker of Scope (a
// prefix made by reap.NewScopedMarker). Exactly one of the two is set.
type ReapOptions struct {
	Marker string
	Scope  string
	Signal syscall.Signal
}

// Reap runs on the host a stage ran on (executors that reach their host
// over a connection, such as ssh, run it as "berth helper reap"). It
// signals every process that carries the marker and, with them, every
// process in the process group of a marked process: a process that
// cleared its environment but stayed in the stage's group is found
// through a marked sibling, and a group is only ever signalled while a
// marked member witnesses that it belongs to the stage (a group id whose
// members are all gone may be reused). The calling process is never
// signalled, even when it carries the marker or sits in a marked group
// (a stage wrapper may exec the helper as its last step).
//
// With SIGKILL, Reap scans again until no such process is left (a stage
// may fork while it is being killed), at most reapPasses times; with any
// other signal it signals once. It returns how many distinct processes
// it signalled. It needs /proc (Linux).
func Reap(o ReapOptions) (int, error) {
	want, prefix, err := o.entry()
	if err != nil {
		return 0, err
	}
	return reapIn("/proc", want, prefix, o.Signal)
}

// reapPasses bounds the SIGKILL rescans; reapPause is the pause between
// them.
const (
	reapPasses = 50
	reapPause  = 5 * time.Millisecond
)

func (o ReapOptions) entry() (want []byte, prefix bool, err error) {
	switch {
	case o.Marker != "" && o.Scope != "":
		return nil, false, errors.New("reap: give a marker or a scope, not both")
	case o.Marker != "":
		// As reap.Signal: a short marker could match other stages.
		if len(o.Marker) < 16 {
			return nil, false, fmt.Errorf("reap: marker %q is too short", o.Marker)
		}
		return []byte(reap.Env(o.Marker)), false, nil
	case o.Scope != "":
		if len(o.Scope) < 8 {
			return nil, false, fmt.Errorf("reap: scope %q is too short", o.Scope)
		}
		return []byte(reap.Env(o.Scope + ".")), true, nil
	}
	return nil, false, errors.New("reap: a marker or a scope is required")
}

// procInfo is what reap needs to know of one process.
type procInfo struct {
	pid, pgid int
	marked    bool
}

func reapIn(procDir string, want []byte, prefix bool, sig syscall.Signal) (int, error) {
	self := os.Getpid()
	signalled := map[int]bool{}
	for pass := 0; ; pass++ {
		procs, err := scanProcs(procDir, want, prefix)
		if err != nil {
			return len(signalled), err
		}
		selfGroup := -1
		witnessed := map[int]bool{}
		for _, p := range procs {
			if p.pid == self {
				selfGroup = p.pgid
			}
			if p.marked && p.pgid > 1 {
				witnessed[p.pgid] = true
			}
		}
		// A witnessed group is signalled as a whole, which the kernel
		// does atomically with respect to fork (a child forked while
		// the scan ran still gets the signal); the caller's own group
		// member by member. Each process gets the signal once.
		whole := map[int]bool{}
		for g := range witnessed {
			if g != selfGroup && syscall.Kill(-g, sig) == nil {
				whole[g] = true
			}
		}
		found := 0
		for _, p := range procs {
			if p.pid == self || p.pid <= 1 || !(p.marked || witnessed[p.pgid]) {
				continue
			}
			found++
			if whole[p.pgid] || syscall.Kill(p.pid, sig) == nil {
				signalled[p.pid] = true
			}
		}
		if found == 0 || sig != syscall.SIGKILL || pass+1 >= reapPasses {
			return len(signalled), nil
		}
		time.Sleep(reapPause)
	}
}

// scanProcs lists the live (not zombie) processes of procDir with their
// process group and whether their initial environment holds want.
func scanProcs(procDir string, want []byte, prefix bool) ([]procInfo, error) {
	entries, err := os.ReadDir(procDir)
	if err != nil {
		return nil, fmt.Errorf("reap: listing processes: %w", err)
	}
	var out []procInfo
	var r reap.EnvironReader
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(procDir + "/" + e.Name() + "/stat")
		if err != nil {
			continue // gone
		}
		state, pgid, ok := parseStat(stat)
		if !ok || state == 'Z' || state == 'X' {
			continue
		}
		p := procInfo{pid: pid, pgid: pgid}
		if env, err := r.Read(procDir + "/" + e.Name()); err == nil {
			p.marked = reap.HasEntry(env, want, prefix)
		}
		out = append(out, p)
	}
	return out, nil
}

// parseStat reads the state and the process group from the contents of
// /proc/<pid>/stat: "pid (comm) state ppid pgrp …", where comm may hold
// spaces and parentheses, so the fields are counted from the last ')'.
func parseStat(b []byte) (state byte, pgid int, ok bool) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 3 || len(f[0]) != 1 {
		return 0, 0, false
	}
	pgid, err := strconv.Atoi(f[2])
	if err != nil {
		return 0, 0, false
	}
	return f[0][0], pgid, true
}

// reapMain is "berth helper reap": it prints "signalled N processes".
func reapMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("berth helper reap", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o ReapOptions
	var sig string
	fs.StringVar(&o.Marker, "marker", "", "stage marker: signal the processes carrying "+reap.Variable+"=MARKER and their process groups")
	fs.StringVar(&o.Scope, "scope", "", "marker scope: signal the processes of every stage whose marker starts with SCOPE.")
	fs.StringVar(&sig, "signal", "TERM", "TERM or KILL")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	switch strings.TrimPrefix(strings.ToUpper(sig), "SIG") {
	case "TERM":
		o.Signal = syscall.SIGTERM
	case "KILL":
		o.Signal = syscall.SIGKILL
	default:
		fmt.Fprintf(stderr, "berth helper reap: --signal %q: want TERM or KILL\n", sig)
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "berth helper reap: unexpected arguments %q\n", fs.Args())
		return 2
	}
	n, err := Reap(o)
	if err != nil {
		fmt.Fprintf(stderr, "ERROR: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "signalled %d processes\n", n)
	return 0
}
