package main

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/berthci/berth/bench"
)

func newBenchCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "bench", Short: "Measure Berth's components and print figures"}
	cmd.AddCommand(newBenchDispatchCmd())
	return cmd
}

func newBenchDispatchCmd() *cobra.Command {
	var (
		o      bench.DispatchOptions
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "dispatch",
		Short: "Dispatch throughput and pickup latency of an in-process coordinator over loopback HTTP",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Progress = cmd.ErrOrStderr()
			res, err := bench.Dispatch(cmd.Context(), o)
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(res)
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "runners        %d\n", res.Runners)
			fmt.Fprintf(out, "cpus           %d\n", res.CPUs)
			fmt.Fprintf(out, "jobs           %d in %.2fs\n", res.Jobs, res.Seconds)
			fmt.Fprintf(out, "throughput     %.0f jobs/s\n", res.JobsPerSecond)
			if res.LatencyJobs > 0 {
				fmt.Fprintf(out, "pickup (%d)  p50 %.2f ms  p99 %.2f ms  max %.2f ms\n", res.LatencyJobs, res.PickupP50Ms, res.PickupP99Ms, res.PickupMaxMs)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.Runners, "runners", 100, "long-polling runner managers")
	f.IntVar(&o.Jobs, "jobs", 10000, "jobs for the throughput phase")
	f.IntVar(&o.LatencyJobs, "latency-jobs", 1000, "jobs enqueued one at a time for the pickup latency phase")
	f.IntVar(&o.Enqueuers, "enqueuers", 4, "goroutines enqueueing in the throughput phase")
	f.BoolVar(&asJSON, "json", false, "print the result as JSON")
	return cmd
}
