// Command berth is the single binary of Berth: coordinator, runner manager,
// helper, simulator and operator tools. main only parses flags and wires
// components; all behaviour lives in the packages.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() { os.Exit(runMain(os.Args[1:])) }

// runMain runs the command line args (without the program name) until
// done or SIGINT/SIGTERM, and returns the exit status.
func runMain(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root := newRootCmd()
	root.SetArgs(args)
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "berth:", err)
		return exitCode(err)
	}
	return 0
}

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "berth",
		Short:         "Berth runs CI jobs: coordinator, runner manager and autoscaler in one binary",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version,
	}
	// The explicit list of subcommands. Each lives in its own file of this
	// package.
	root.AddCommand(
		newServerCmd(),
		newRunnersCmd(),
		newBenchCmd(),
		newCICmd(),
		newRunnerCmd(),
		newHelperCmd(),
		newFleetingCmd(),
		newPipelinesCmd(),
		newJobsCmd(),
		newRunCmd(),
		newSimCmd(),
		newChaosCmd(),
		newExecutorPluginCmd(),
		newFleetingPluginCmd(),
		newUpCmd(),
		newNestingCmd(),
		newImageCmd(),
		newGuestCmd(),
		newReleasesCmd(), newEnvironmentsCmd(), newDeploymentsCmd(),
		newRouterCmd(),
		newUsersCmd(),
		newMembersCmd(),
		newSchedulesCmd(),
		newTriggersCmd(),
		newDebugCmd(),
	// berth:commands
	)
	return root
}

// exitError carries a process exit code through cobra.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func exitCode(err error) int {
	if ee, ok := err.(*exitError); ok {
		return ee.code
	}
	return 1
}
