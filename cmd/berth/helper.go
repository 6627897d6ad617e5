package main

import (
	"fmt"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/berthci/berth/runner/helper"
)

// newHelperCmd is "berth helper …": what job scripts run inside the job's
// environment for work a shell cannot do (archives, artifacts API). Flags
// are parsed by package helper, so the same code serves every executor.
func newHelperCmd() *cobra.Command {
	var names []string
	for n := range helper.Commands {
		names = append(names, n)
	}
	sort.Strings(names)
	var long strings.Builder
	long.WriteString("Run inside a job's environment by the scripts the runner generates.\n\nCommands:\n")
	for _, n := range names {
		fmt.Fprintf(&long, "  %-20s %s\n", n, helper.Commands[n])
	}
	long.WriteString("\nThe job token is read from $" + helper.TokenEnv + ". Use \"berth helper COMMAND -h\" for a command's flags.")
	return &cobra.Command{
		Use:                "helper COMMAND [flags]",
		Short:              "Job-side helper: artifact and cache archives, artifact upload and download",
		Long:               long.String(),
		DisableFlagParsing: true,
		Hidden:             false,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
				return cmd.Help()
			}
			if code := helper.Main(cmd.Context(), args, cmd.OutOrStdout(), cmd.ErrOrStderr(), version); code != 0 {
				return &exitError{code: code, err: fmt.Errorf("helper %s failed", args[0])}
			}
			return nil
		},
	}
}
