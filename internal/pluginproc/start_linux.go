package pluginproc

import (
	"os/exec"
	"runtime"
	"sync"
	"syscall"
)

// StartProcess starts cmd. With deathSignal the kernel sends SIGKILL to the
// plugin when the host dies, however it dies (PR_SET_PDEATHSIG).
//
// The death signal fires when the *thread* that forked the child exits, not
// the process, and the Go runtime may retire threads. So every plugin is
// forked from one goroutine locked to its OS thread for the life of the
// process: that thread ends only with the host.
func StartProcess(cmd *exec.Cmd, deathSignal bool) error {
	if !deathSignal {
		return cmd.Start()
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	spawnOnce.Do(func() { go spawner() })
	done := make(chan error, 1)
	spawnCh <- spawnReq{cmd: cmd, done: done}
	return <-done
}

type spawnReq struct {
	cmd  *exec.Cmd
	done chan error
}

var (
	spawnOnce sync.Once
	spawnCh   = make(chan spawnReq)
)

func spawner() {
	runtime.LockOSThread() // never unlocked: the thread lives as long as the host
	for r := range spawnCh {
		r.done <- r.cmd.Start()
	}
}
