package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/berthci/berth/coordinator/client"
	"github.com/berthci/berth/coordinator/restapi"
)

func newJobsCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "jobs", Short: "Follow and act on jobs on a coordinator (admin, or a member of the project with --token)"}
	cmd.AddCommand(newJobsLogCmd(), newJobActionCmd("play", "Play a manual job (or run a delayed one now)", (*client.Client).PlayJob),
		newJobActionCmd("retry", "Retry a finished job; prints the new job", (*client.Client).RetryJob),
		newJobActionCmd("cancel", "Cancel a job", (*client.Client).CancelJob))
	return cmd
}

// jobFinished are the statuses after which a trace does not grow.
var jobFinished = map[string]bool{"success": true, "failed": true, "canceled": true, "skipped": true}

func newJobsLogCmd() *cobra.Command {
	var (
		af       adminFlags
		follow   bool
		interval time.Duration
	)
	cmd := &cobra.Command{
		Use:   "log ID",
		Short: "Print a job's trace; with -f, follow it until the job ends",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseID(args[0])
			if err != nil {
				return err
			}
			c, err := af.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			j, err := c.JobByID(ctx, id)
			if err != nil {
				return err
			}
			return followTrace(cmd, c, j.Project.ID, id, follow, interval, cmd.OutOrStdout())
		},
	}
	af.register(cmd)
	af.registerUserToken(cmd, "a member of the job's project")
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "follow the trace until the job ends")
	cmd.Flags().DurationVar(&interval, "interval", time.Second, "how often to poll when following")
	return cmd
}

// followTrace prints the trace from the start; when following, it polls
// for new bytes (from the offset printed so far) until the job is finished
// and its trace read to the end.
func followTrace(cmd *cobra.Command, c *client.Client, project, id int64, follow bool, interval time.Duration, w io.Writer) error {
	ctx := cmd.Context()
	var offset int64
	for {
		n, status, err := c.TraceFrom(ctx, project, id, offset, w)
		if err != nil {
			return err
		}
		offset += n
		if !follow || (jobFinished[status] && n == 0) {
			return nil
		}
		if jobFinished[status] {
			continue // read what arrived before it finished
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(interval):
		}
	}
}

func newJobActionCmd(use, short string, act func(*client.Client, context.Context, int64, int64) (*restapi.JobJSON, error)) *cobra.Command {
	var af adminFlags
	cmd := &cobra.Command{
		Use:   use + " ID",
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseID(args[0])
			if err != nil {
				return err
			}
			c, err := af.client()
			if err != nil {
				return err
			}
			j, err := c.JobByID(cmd.Context(), id)
			if err != nil {
				return err
			}
			out, err := act(c, cmd.Context(), j.Project.ID, id)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "job %d %s: %s\n", out.ID, out.Name, out.Status)
			return nil
		},
	}
	af.register(cmd)
	af.registerUserToken(cmd, "a member of the job's project")
	return cmd
}
