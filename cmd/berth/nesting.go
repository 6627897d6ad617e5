package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/berthci/berth/nesting"
	"github.com/berthci/berth/nesting/qemu"
)

// hypervisors are the hypervisors `berth nesting serve` can run, by name.
var hypervisors = map[string]func(log *slog.Logger) nesting.Hypervisor{
	"qemu": func(log *slog.Logger) nesting.Hypervisor { return qemu.New(log) },
}

// defaultHypervisor is the --hypervisor of `berth nesting serve`.
const defaultHypervisor = "qemu"

// newNestingCmd is `berth nesting`: the VM-per-slot daemon of an instance
// and a client for it (Berth's or GitLab's nesting daemon).
func newNestingCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "nesting",
		Short: "Run a nesting daemon (one VM per slot) or talk to one",
		Long: `A nesting daemon creates and deletes VMs on an instance for runners, over
GitLab's nesting gRPC API on a unix socket: Berth's runner and GitLab Runner
([runners.autoscaler.vm_isolation]) both drive it, and these commands drive
Berth's daemon or GitLab's alike.

The socket is $NESTING_SOCKET, or nesting.sock in $XDG_RUNTIME_DIR, or in the
home directory when that is unset (see docs/nesting.md).`,
	}
	cmd.AddCommand(newNestingServeCmd(), newNestingInitCmd(), newNestingCreateCmd(),
		newNestingDeleteCmd(), newNestingListCmd(), newNestingShutdownCmd(), newNestingVersionCmd())
	return cmd
}

func hypervisorNames() string {
	names := make([]string, 0, len(hypervisors))
	for name := range hypervisors {
		names = append(names, name)
	}
	if len(names) == 0 {
		return "none in this build"
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

func newNestingServeCmd() *cobra.Command {
	var hvName, configFile, socket, logLevel, logFormat string
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the nesting daemon until SIGINT or SIGTERM",
		Long: `Run the nesting daemon on a unix socket until SIGINT or SIGTERM. On exit it
shuts the hypervisor down (every VM stops) and removes the socket.

With --config, the daemon initializes its hypervisor with that JSON file at
start; otherwise the first client's Init does (GitLab Runner sends its
nesting_config).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			newHV, ok := hypervisors[hvName]
			if !ok {
				return &exitError{code: 2, err: fmt.Errorf("unknown hypervisor %q (known: %s)", hvName, hypervisorNames())}
			}
			var config []byte
			if configFile != "" {
				var err error
				if config, err = os.ReadFile(configFile); err != nil {
					return fmt.Errorf("--config: %w", err)
				}
			}
			log := runnerLogger(cmd.ErrOrStderr(), logFormat, logLevel).With("hypervisor", hvName)
			l, err := nesting.Listen(socket)
			if err != nil {
				return err
			}
			hv := newHV(log)
			srv := nesting.NewServer(hv, log)
			if config != nil {
				if err := srv.Init(cmd.Context(), config); err != nil {
					l.Close()
					ctx, cancel := context.WithTimeout(context.WithoutCancel(cmd.Context()), nesting.ShutdownTimeout)
					defer cancel()
					hv.Shutdown(ctx)
					return fmt.Errorf("initializing with %s: %w", configFile, err)
				}
			}
			log.Info("nesting daemon listening", "socket", socket)
			return srv.Serve(cmd.Context(), l)
		},
	}
	f := cmd.Flags()
	f.StringVar(&hvName, "hypervisor", defaultHypervisor, "the hypervisor that runs the VMs")
	f.StringVar(&configFile, "config", "", "JSON config to initialize the hypervisor with at start")
	f.StringVar(&socket, "socket", nesting.DefaultSocket(), "unix socket to listen on")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&logFormat, "log-format", "text", "text or json")
	return cmd
}

// nestingDialTimeout bounds connecting to the daemon (not the calls: a
// Create may boot a VM for minutes).
const nestingDialTimeout = 30 * time.Second

// nestingClientCmd builds a client command: it dials --host and runs fn.
func nestingClientCmd(cmd *cobra.Command, fn func(cmd *cobra.Command, c *nesting.Client, args []string) error) *cobra.Command {
	var host string
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		dctx, cancel := context.WithTimeout(cmd.Context(), nestingDialTimeout)
		defer cancel()
		c, err := nesting.Dial(dctx, host)
		if err != nil {
			return err
		}
		defer c.Close()
		return fn(cmd, c, args)
	}
	cmd.Flags().StringVar(&host, "host", "", "the daemon: unix:///path, unix:path, tcp://host:port (default: unix://"+nesting.DefaultSocket()+")")
	return cmd
}

func newNestingInitCmd() *cobra.Command {
	var configFile string
	cmd := nestingClientCmd(&cobra.Command{
		Use:   "init",
		Short: "Initialize the daemon's hypervisor with a JSON config (default {})",
		Args:  cobra.NoArgs,
	}, func(cmd *cobra.Command, c *nesting.Client, _ []string) error {
		config := []byte("{}")
		if configFile != "" {
			var err error
			if config, err = os.ReadFile(configFile); err != nil {
				return fmt.Errorf("--config: %w", err)
			}
		}
		return c.Init(cmd.Context(), config)
	})
	cmd.Flags().StringVar(&configFile, "config", "", "JSON config file")
	return cmd
}

func newNestingCreateCmd() *cobra.Command {
	return nestingClientCmd(&cobra.Command{
		Use:   "create IMAGE [SLOT]",
		Short: "Create a VM from IMAGE, in SLOT (deleting the slot's VM); prints id name addr",
		Args:  cobra.RangeArgs(1, 2),
	}, func(cmd *cobra.Command, c *nesting.Client, args []string) error {
		var slot *int32
		if len(args) == 2 {
			n, err := strconv.ParseInt(args[1], 10, 32)
			if err != nil {
				return &exitError{code: 2, err: fmt.Errorf("slot %q: want a number", args[1])}
			}
			s := int32(n)
			slot = &s
		}
		vm, stomped, err := c.Create(cmd.Context(), args[0], slot)
		if err != nil {
			return err
		}
		out := cmd.OutOrStdout()
		fmt.Fprintln(out, vm.ID, vm.Name, vm.Addr)
		if stomped != "" {
			fmt.Fprintf(out, "stomped vm id %q\n", stomped)
		}
		return nil
	})
}

func newNestingDeleteCmd() *cobra.Command {
	return nestingClientCmd(&cobra.Command{
		Use:   "delete ID",
		Short: "Delete the VM ID",
		Args:  cobra.ExactArgs(1),
	}, func(cmd *cobra.Command, c *nesting.Client, args []string) error {
		return c.Delete(cmd.Context(), args[0])
	})
}

func newNestingListCmd() *cobra.Command {
	var asJSON bool
	cmd := nestingClientCmd(&cobra.Command{
		Use:   "list",
		Short: "List the daemon's VMs: id name addr, one a line",
		Args:  cobra.NoArgs,
	}, func(cmd *cobra.Command, c *nesting.Client, _ []string) error {
		vms, err := c.List(cmd.Context())
		if err != nil {
			return err
		}
		out := cmd.OutOrStdout()
		if asJSON {
			enc := json.NewEncoder(out)
			enc.SetIndent("", "  ")
			return enc.Encode(vms)
		}
		for _, vm := range vms {
			fmt.Fprintln(out, vm.ID, vm.Name, vm.Addr)
		}
		return nil
	})
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array of {id, name, addr}")
	return cmd
}

func newNestingShutdownCmd() *cobra.Command {
	return nestingClientCmd(&cobra.Command{
		Use:   "shutdown",
		Short: "Stop every VM of the daemon and leave it uninitialized",
		Args:  cobra.NoArgs,
	}, func(cmd *cobra.Command, c *nesting.Client, _ []string) error {
		return c.Shutdown(cmd.Context())
	})
}

func newNestingVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), "berth nesting", version)
			return err
		},
	}
}
