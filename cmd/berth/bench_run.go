package main

import (
	"encoding/json"
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/berthci/berth/bench"
)

func newBenchRunCmd() *cobra.Command {
	var (
		o      bench.RunOptions
		asJSON bool
		print  bool
	)
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Time berth run on a generated fan-out/fan-in pipeline, beside another command (--against)",
		Long: `Time berth run on a generated pipeline of --jobs shell jobs: half of them write an
artifact, the other half each read one through needs (or on --dir). With --against CMD, CMD
runs on the same directory (sh -c, in the directory) after each berth run, --runs times, and
the best and median of each are printed side by side. The directory is a git repository
with one commit, as local runners such as gitlab-ci-local want.

Also measures the per-job overhead: for each job, the time from its hand-out to its final
update less its scripts; on the generated pipeline's best run, and on a chain of
--trivial-jobs ` + "`true`" + ` jobs run one at a time.

Example: berth bench run --jobs 20 --against "npx gitlab-ci-local"`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if print {
				_, err := fmt.Fprint(cmd.OutOrStdout(), bench.FanPipeline(o.Jobs))
				return err
			}
			self, err := os.Executable()
			if err != nil {
				return err
			}
			o.Berth = self
			o.Progress = cmd.ErrOrStderr()
			res, err := bench.Run(cmd.Context(), o)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return json.NewEncoder(out).Encode(res)
			}
			fmt.Fprintf(out, "pipeline: %d jobs, best and median of %d runs\n", res.Jobs, res.Runs)
			tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
			fmt.Fprintln(tw, "\tbest\tmedian\tper job\t")
			row := func(t bench.RunTimings) {
				fmt.Fprintf(tw, "%s\t%.2fs\t%.2fs\t%.1fms\t\n", t.Command, t.Best, t.Median, t.PerJob*1000)
			}
			row(res.Berth)
			if res.Against != nil {
				row(*res.Against)
			}
			tw.Flush()
			if res.Against != nil {
				fmt.Fprintf(out, "berth run takes %.2f× the time of %s\n", res.Ratio, res.Against.Command)
			}
			fmt.Fprintf(out, "per-job overhead (hand-out to final update, less the scripts): median %.1fms, p95 %.1fms\n",
				res.Overhead.Median*1000, res.Overhead.P95*1000)
			if t := res.Trivial; t != nil {
				fmt.Fprintf(out, "trivial jobs (%d `true` jobs, one at a time): overhead median %.1fms, p95 %.1fms\n", t.N, t.Median*1000, t.P95*1000)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.Jobs, "jobs", 20, "jobs of the generated pipeline")
	f.StringVar(&o.Dir, "dir", "", "run this directory's pipeline instead of a generated one")
	f.StringVar(&o.Against, "against", "", "command to time on the same directory (sh -c)")
	f.IntVar(&o.Runs, "runs", 3, "runs of each command")
	f.IntVar(&o.TrivialJobs, "trivial-jobs", 10, "length of the chain of true jobs for the overhead figure")
	f.BoolVar(&o.NoTrivial, "no-trivial", false, "skip the chain of true jobs")
	f.BoolVar(&asJSON, "json", false, "print the result as JSON")
	f.BoolVar(&print, "print-pipeline", false, "print the generated .gitlab-ci.yml and exit")
	return cmd
}
