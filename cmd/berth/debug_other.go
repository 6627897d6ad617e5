//go:build !linux

package main

import (
	"errors"

	"github.com/spf13/cobra"
)

// newDebugCmd: restoring a VM snapshot needs Linux's QEMU code
// (nesting/qemu); elsewhere the command only says so.
func newDebugCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "debug JOB_ID",
		Short: "Restore a failed job's VM snapshot and open a shell in it (Linux only)",
		RunE: func(*cobra.Command, []string) error {
			return errors.New("berth debug restores VMs with QEMU on Linux only")
		},
	}
}
