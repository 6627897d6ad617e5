//go:build !linux

package main

import (
	"errors"

	"github.com/spf13/cobra"
)

// newGuestCmd: the microVM agent is Linux's (guest/); elsewhere the
// command only says so.
func newGuestCmd() *cobra.Command {
	return &cobra.Command{
		Use:    "guest",
		Short:  "The agent inside a Berth microVM (Linux only)",
		Hidden: true,
		RunE: func(*cobra.Command, []string) error {
			return errors.New("berth guest runs inside a Linux VM only")
		},
	}
}
