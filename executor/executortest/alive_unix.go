//go:build unix

package executortest

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// hostAlive reports whether pid runs on this host and is not a zombie
// (a killed process whose parent has not reaped it yet is gone for the
// purpose of the suite).
func hostAlive(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil && errors.Is(err, syscall.ESRCH) {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	// state is the field after the parenthesised command name.
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z'
	}
	return true
}
