//go:build linux

package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/spf13/cobra"

	"github.com/berthci/berth/guest"
)

// newGuestCmd is the agent inside a microVM (package guest): the
// initramfs runs `berth guest --init` as PID 1, which starts
// `berth guest --serve --root DIR`. Hidden: it only makes sense in a VM.
func newGuestCmd() *cobra.Command {
	var initMode, serve bool
	var root, port string
	cmd := &cobra.Command{
		Use:    "guest (--init | --serve --root DIR)",
		Short:  "The agent inside a Berth microVM (run by the VM's init)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case initMode && os.Getpid() != 1:
				return errors.New("berth guest --init is the VM's init and runs as PID 1 only")
			case initMode:
				err := guest.Init(guest.InitOptions{Agent: []string{"/berth/berth", "guest", "--serve"}, Console: os.Stderr})
				fmt.Fprintf(os.Stderr, "berth init: %v; powering off\n", err)
				guest.Poweroff()
				return err
			case serve:
				if root == "" {
					return errors.New("berth guest --serve: --root is required")
				}
				dev := port
				if dev == "" {
					var err error
					if dev, err = guest.FindPort(guest.PortName); err != nil {
						return fmt.Errorf("berth guest: %w", err)
					}
				}
				log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
				a := &guest.Agent{Root: root, Version: version, Logger: log, NoChroot: root == "/"}
				return guest.Serve(a, dev)
			}
			return errors.New("berth guest: --init or --serve")
		},
	}
	f := cmd.Flags()
	f.BoolVar(&initMode, "init", false, "run as the VM's init (PID 1)")
	f.BoolVar(&serve, "serve", false, "serve the agent on the VM's virtio-serial port")
	f.StringVar(&root, "root", "", "the job's root filesystem (scripts run chrooted into it; / runs them unchrooted)")
	f.StringVar(&port, "port", "", "the port device (default: the virtio-serial port named "+guest.PortName+")")
	return cmd
}
