//go:build !linux

package pluginproc

import "os/exec"

// StartProcess starts cmd. Outside Linux there is no parent-death signal;
// plugins built with fleeting/sdk notice the host is gone by themselves.
func StartProcess(cmd *exec.Cmd, _ bool) error { return cmd.Start() }
