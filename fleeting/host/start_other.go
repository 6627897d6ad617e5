//go:build !linux

package host

import "os/exec"

// startProcess starts cmd. Outside Linux there is no parent-death signal;
// plugins built with fleeting/sdk notice the host is gone by themselves.
func startProcess(cmd *exec.Cmd, _ bool) error { return cmd.Start() }
