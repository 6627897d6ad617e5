package main

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/berthci/berth/chaos"
	"github.com/berthci/berth/executor/docker"
)

// newChaosCmd is `berth chaos`: a real deployment under faults, then the
// invariants.
func newChaosCmd() *cobra.Command {
	var (
		o      chaos.Options
		faults string
		keep   bool
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "chaos",
		Short: "Run a coordinator and runner managers under kills, pauses and network faults, then check nothing was lost",
		Long: `Starts a coordinator and runner managers as processes of this binary on loopback,
with a fault-injecting proxy between the runners (and their jobs) and the
coordinator, and runs a workload of pipelines (needs, artifacts, cache, parallel,
retries, a flaky job, manual jobs played, pipelines canceled) while it kills
(SIGKILL) and pauses (SIGSTOP) the components and makes the network drop, delay,
reset and truncate connections. When the workload is in, the faults stop, every
pipeline drains, and the invariants are checked: nothing lost, stuck, run twice,
no log line lost or reordered, no artifact lost, no process orphaned, pipelines
consistent with their jobs.

Faults: kill-coordinator, pause-coordinator, kill-runner, pause-runner, drop,
delay, reset, truncate, and with --executor instance kill-plugin (--faults,
comma-separated; default all that apply).

The workload and the fault schedule come from --seed: a failing seed is printed
and can be run again. Exit status 0 when every invariant held, 1 otherwise.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			bin, err := os.Executable()
			if err != nil {
				return err
			}
			o.Binary = bin
			if faults != "" {
				o.Faults = strings.Split(faults, ",")
			}
			if o.Dir == "" {
				if o.Dir, err = os.MkdirTemp("", "berth-chaos-"); err != nil {
					return err
				}
				if !keep {
					defer os.RemoveAll(o.Dir)
				}
			}
			o.Progress = cmd.ErrOrStderr()
			if o.Executor == "docker" {
				// Containers reach the proxy at this host's bridge address.
				p, err := docker.New(cmd.Context(), docker.Options{})
				if err != nil {
					return &exitError{code: 2, err: err}
				}
				o.DockerHost, err = p.HostAddress(cmd.Context())
				p.Shutdown(cmd.Context())
				if err != nil {
					return &exitError{code: 2, err: err}
				}
			}
			rep, err := chaos.Run(cmd.Context(), o)
			if err != nil {
				return &exitError{code: 2, err: fmt.Errorf("chaos run (seed %d, directory %s): %w", o.Seed, o.Dir, err)}
			}
			out := cmd.OutOrStdout()
			if asJSON {
				if err := json.NewEncoder(out).Encode(rep); err != nil {
					return err
				}
			} else {
				printChaos(out, rep)
			}
			if !rep.OK() {
				return &exitError{code: 1, err: fmt.Errorf("seed %d: %d invariant violations (components' logs: %s)", rep.Seed, len(rep.Violations), o.Dir)}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.Jobs, "jobs", 100, "about how many jobs to run (whole pipelines of 6)")
	f.Uint64Var(&o.Seed, "seed", 1, "seed of the workload and the fault schedule")
	f.IntVar(&o.Runners, "runners", 2, "runner managers")
	f.IntVar(&o.Concurrent, "concurrent", 4, "jobs each runner manager runs at once")
	f.StringVar(&o.Executor, "executor", "shell", "the runners' executor: shell, docker, or instance (jobs on instances of the local fleeting plugin each runner autoscales; adds the kill-plugin fault)")
	f.StringVar(&o.Image, "image", "", "with --executor docker: the jobs' image (local, with bash and git)")
	f.StringVar(&faults, "faults", "", "faults to inject, comma-separated (default: all)")
	f.DurationVar(&o.FaultEvery, "fault-every", 2*time.Second, "mean time between faults")
	f.DurationVar(&o.StuckTimeout, "stuck-timeout", 15*time.Second, "the coordinator's --stuck-timeout (a job whose runner died fails and is retried after it)")
	f.StringVar(&o.Dir, "dir", "", "directory of the run (default: a temporary one, removed unless --keep)")
	f.BoolVar(&keep, "keep", false, "keep the temporary directory (data, configs, components' logs)")
	f.BoolVar(&asJSON, "json", false, "print the report as JSON")
	return cmd
}

func printChaos(w interface{ Write([]byte) (int, error) }, r *chaos.Report) {
	fmt.Fprintf(w, "seed %d: %d pipelines, %d jobs in %.0f s\n", r.Seed, r.Pipelines, r.Jobs, r.DurationSec)
	fmt.Fprintf(w, "jobs:   %s\n", counts(r.JobsByStatus))
	fmt.Fprintf(w, "failed: %s\n", counts(r.FailureReasons))
	fmt.Fprintf(w, "faults: %s\n", counts(r.Faults))
	fmt.Fprintf(w, "lost %d  stuck %d  duplicated %d  trace errors %d  artifacts lost %d  orphaned %d  inconsistent pipelines %d\n",
		r.Lost, r.Stuck, r.Duplicated, r.TraceErrors, r.ArtifactsLost, r.Orphaned, r.Inconsistent)
	for _, f := range r.FailureSamples {
		fmt.Fprintf(w, "failed job: %s\n", f)
	}
	for _, v := range r.Violations {
		fmt.Fprintf(w, "VIOLATION: %s\n", v)
	}
}

func counts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}
