package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/berthci/berth/coordinator/queue"
	"github.com/berthci/berth/fleeting/plugins/fake"
	"github.com/berthci/berth/taskscaler"
	"github.com/berthci/berth/taskscaler/sim"
)

// newSimCmd is `berth sim`: the autoscaler in virtual time on a simulated
// cloud.
func newSimCmd() *cobra.Command {
	var (
		workload, trace, configFile, runner, plotFile string
		writeTrace, explain                           string
		hours, jobShare                               float64
		days                                          int
		seed                                          uint64
		boot, bootStddev, bootMin, deleteLatency      time.Duration
		vanishAfter                                   time.Duration
		increaseErr, neverRunning, vanish, readyFail  float64
		maxSize, idleCount, capacity                  int
		prediction, packing, runUntagged              bool
		tagList                                       []string
		spare                                         string
		asJSON                                        bool
	)
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Simulate the autoscaler in virtual time on a fake cloud and print waits and cost",
		Long: `Runs Berth's real taskscaler in virtual time against the fake fleeting plugin,
in-process: a day of traffic takes about a second, and the same inputs give the
same outputs.

The workload is built in (--workload steady|workday|hourly-burst|spiky|varied|scheduled|pipelines|random,
starting Monday 00:00 UTC, over --hours or --days; varied draws every day anew and
scheduled draws a team's schedules: for multi-day runs; random draws a team's traffic
from the seed, to try many shapes: it prints what it drew) or a trace (--trace FILE): CSV
(arrival_seconds,duration_seconds[,tags]), or the JSON of GitLab's jobs API
(GET /runners/:id/jobs or /projects/:id/jobs, pages one after another: a job arrives
at started_at - queued_duration and lasts duration; jobs that never started are left
out; times from the Monday 00:00 UTC before the first job). A trace runs from
00:00 of its first job's day (the days before are not billed) to its last job,
or with --days or --hours over its first days or hours only.
--tag-list T1,T2 [--run-untagged] keeps the jobs of a trace a runner with those tags
would take; --job-share 0.1 keeps a tenth of the jobs (a smaller team's traffic). --write-trace FILE writes the jobs simulated as a CSV trace.
The autoscaler configuration is the [runners.autoscaler] table of a config.toml
(--config, --runner to pick the entry); without it a default with
capacity_per_instance = 4 and 4 idle slots on weekday business hours is used.

Printed: jobs, waits (arrival to slot) p50/p95/p99/max, instance-hours billed
(request to end of deletion) and how many of them idle, instances created,
failed acquisitions, and the clairvoyant lower bound (sum of job durations /
capacity_per_instance, zero wait) with cost / lower bound; for a run of more than
a day, the same per day (jobs and waits by the day they arrived; billing and
bounds by the day they fall in).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var cfg sim.Config
			var err error
			horizon := time.Duration(hours * float64(time.Hour))
			if days < 0 {
				return &exitError{code: 2, err: fmt.Errorf("--days %d: want a positive number of days", days)}
			}
			if days > 0 {
				if cmd.Flags().Changed("hours") {
					return &exitError{code: 2, err: errors.New("--days and --hours: give one")}
				}
				horizon = time.Duration(days) * 24 * time.Hour
			}
			label := workload
			if trace != "" {
				f, err := os.Open(trace)
				if err != nil {
					return fmt.Errorf("sim: %w", err)
				}
				tr, err := sim.ReadTrace(f)
				f.Close()
				if err != nil {
					return fmt.Errorf("sim: %s: %w", trace, err)
				}
				cfg.Jobs = tr.Jobs
				if tr.LeftOut > 0 {
					fmt.Fprintf(cmd.ErrOrStderr(), "sim: %s: %d jobs left out (never started, or not finished)\n", trace, tr.LeftOut)
				}
				if cmd.Flags().Changed("tag-list") || cmd.Flags().Changed("run-untagged") {
					if !cmd.Flags().Changed("run-untagged") {
						runUntagged = len(tagList) == 0 // as a runner registered without --run-untagged
					}
					taken := map[string]bool{}
					for _, t := range tagList {
						if t = strings.TrimSpace(t); t != "" {
							taken[t] = true
						}
					}
					if len(taken) == 0 && !runUntagged {
						return &exitError{code: 2, err: errors.New("--run-untagged=false without --tag-list: that runner would take no job (GitLab refuses to register it)")}
					}
					// The coordinator's own match, as for an instance-wide runner.
					r := &queue.Runner{Scope: queue.Instance, Tags: taken, RunUntagged: runUntagged}
					n := len(cfg.Jobs)
					cfg.Jobs = slices.DeleteFunc(cfg.Jobs, func(j sim.Job) bool { return !r.Admits(&queue.Job{Tags: traceTags(j.Tags)}) })
					fmt.Fprintf(cmd.ErrOrStderr(), "sim: %s: %d of %d jobs are for this runner's tags (%s), %d left out\n",
						trace, len(cfg.Jobs), n, describeTags(taken, runUntagged), n-len(cfg.Jobs))
				}
				label = trace
				// The run starts on the day of the trace's first job: the
				// days before it would bill the floors for nothing.
				if len(cfg.Jobs) > 0 {
					cfg.From = sim.FirstDay(cfg.Jobs[0].Arrival)
				}
				if cmd.Flags().Changed("days") || cmd.Flags().Changed("hours") {
					// The trace's first days or hours only.
					horizon += cfg.From
					cfg.Jobs = slices.DeleteFunc(cfg.Jobs, func(j sim.Job) bool { return j.Arrival >= horizon })
				} else {
					horizon = 0 // until its last job
				}
			} else if cmd.Flags().Changed("tag-list") || cmd.Flags().Changed("run-untagged") {
				return &exitError{code: 2, err: errors.New("--tag-list and --run-untagged pick jobs of a --trace; built-in workloads have no tags")}
			} else if cfg.Jobs, err = sim.Generate(workload, horizon, seed); err != nil {
				return fmt.Errorf("sim: %w", err)
			}
			cfg.Horizon = horizon
			if cmd.Flags().Changed("job-share") {
				if !(jobShare > 0 && jobShare <= 1) {
					return &exitError{code: 2, err: fmt.Errorf("--job-share %v: want a share of the jobs above 0, at most 1", jobShare)}
				}
				n := len(cfg.Jobs)
				cfg.Jobs = sim.Thin(cfg.Jobs, jobShare, seed)
				fmt.Fprintf(cmd.ErrOrStderr(), "sim: --job-share %v kept %d of %d jobs\n", jobShare, len(cfg.Jobs), n)
			}
			if writeTrace != "" {
				if err := writeSimTrace(writeTrace, cfg.Jobs); err != nil {
					return fmt.Errorf("sim: %w", err)
				}
			}
			var unknown []string
			if configFile != "" {
				data, err := os.ReadFile(configFile)
				if err != nil {
					return fmt.Errorf("sim: %w", err)
				}
				if cfg.Autoscaler, unknown, err = sim.AutoscalerFromTOML(data, runner); err != nil {
					return fmt.Errorf("sim: %s: %w", configFile, err)
				}
			} else if cfg.Autoscaler, unknown, err = taskscaler.DecodeConfig(sim.DefaultAutoscaler); err != nil {
				return err
			}
			for _, k := range unknown {
				fmt.Fprintf(cmd.ErrOrStderr(), "berth sim: warning: %s is not a key Berth knows; ignored\n", k)
			}
			if cfg.Autoscaler.StateStorage.Enabled {
				fmt.Fprintln(cmd.ErrOrStderr(), "berth sim: warning: state_storage is ignored in a simulation")
			}
			if capacity > 0 {
				cfg.Autoscaler.CapacityPerInstance = capacity
			}
			if cmd.Flags().Changed("prediction") {
				cfg.Autoscaler.Prediction = &prediction
			}
			if cmd.Flags().Changed("packing") {
				cfg.Autoscaler.Packing = &packing
			}
			if cmd.Flags().Changed("prediction-spare") {
				cfg.Autoscaler.PredictionSpare = spare
			}
			if idleCount >= 0 {
				for i := range cfg.Autoscaler.Policies {
					cfg.Autoscaler.Policies[i].IdleCount = idleCount
				}
			}
			bootDist := fake.Fixed(boot)
			if bootStddev > 0 {
				bootDist = fake.Distribution{Kind: "lognormal", Mean: fake.Duration(boot), StdDev: fake.Duration(bootStddev)}
			}
			bootDist.Min = fake.Duration(bootMin)
			cfg.Cloud = fake.Config{Name: "sim", MaxSize: maxSize, BootLatency: bootDist, DeleteLatency: fake.Fixed(deleteLatency),
				IncreaseErrorRate: increaseErr, NeverRunningRate: neverRunning, VanishRate: vanish, VanishAfter: fake.Distribution{Kind: "exponential", Mean: fake.Duration(vanishAfter)}}
			if err := cfg.Cloud.Validate(); err != nil {
				return fmt.Errorf("sim: cloud: %w", err)
			}
			cfg.Seed, cfg.ReadyFailureRate = seed, readyFail
			var decisions bytes.Buffer
			if explain != "" {
				from, err := parseExplain(explain)
				if err != nil {
					return &exitError{code: 2, err: err}
				}
				if from < sim.FirstDay(cfg.From) {
					first := sim.Day{Day: int(cfg.From / (24 * time.Hour))}
					return &exitError{code: 2, err: fmt.Errorf("--explain %s: the run starts on day %d (%s), the day of the trace's first job", explain, first.Day+1, first.Weekday())}
				}
				cfg.Explain, cfg.ExplainFrom, cfg.ExplainTo = &decisions, from, from+time.Hour
			}
			warnings := &warningTally{}
			cfg.Logger = slog.New(warnings)
			res, err := sim.Run(cmd.Context(), cfg)
			if err != nil {
				return fmt.Errorf("sim: %w", err)
			}
			warnings.print(cmd.ErrOrStderr())
			if plotFile != "" {
				f, err := os.Create(plotFile)
				if err != nil {
					return fmt.Errorf("sim: %w", err)
				}
				title := fmt.Sprintf("berth sim: %s, seed %d, capacity %d, boot %s", label, seed, cfg.Autoscaler.CapacityPerInstance, boot)
				err = errors.Join(sim.WriteSVG(f, res, cfg.Autoscaler.CapacityPerInstance, title), f.Close())
				if err != nil {
					return fmt.Errorf("sim: plot: %w", err)
				}
			}
			out := cmd.OutOrStdout()
			if explain != "" {
				// After the figures, or on stderr beside --json.
				w := out
				if asJSON {
					w = cmd.ErrOrStderr()
				}
				defer func() {
					fmt.Fprintf(w, "\ndecisions of hour %s (those that act or change the figures; slots):\n", explain)
					if decisions.Len() == 0 {
						fmt.Fprintln(w, "(none)")
					}
					w.Write(decisions.Bytes())
				}()
			}
			drawn := ""
			if trace == "" {
				drawn = sim.Describe(workload, seed)
			}
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				// What was run beside its figures, so that a script's
				// results say which workload and seed (and, for random,
				// which traffic) they are of.
				return enc.Encode(struct {
					Workload string `json:"workload"`
					Seed     uint64 `json:"seed"`
					Drawn    string `json:"drawn,omitempty"`
					*sim.Result
				}{label, seed, drawn, &res})
			}
			fmt.Fprintf(out, "workload             %s (seed %d, %s simulated)\n", label, seed, time.Duration(res.SimulatedSeconds*float64(time.Second)).Round(time.Second))
			if drawn != "" {
				fmt.Fprintf(out, "drawn                %s\n", drawn)
			}
			fmt.Fprintf(out, "jobs                 %d (completed %d, failed acquisitions %d, lost with their instance %d)\n", res.Jobs, res.Completed, res.FailedAcquisitions, res.LostJobs)
			fmt.Fprintf(out, "wait                 p50 %s  p95 %s  p99 %s  max %s  (mean %s)\n", secs(res.WaitP50), secs(res.WaitP95), secs(res.WaitP99), secs(res.WaitMax), secs(res.WaitMean))
			fmt.Fprintf(out, "instance-hours       %.1f (idle %.1f)\n", res.InstanceSeconds/3600, res.IdleInstanceSecs/3600)
			fmt.Fprintf(out, "instances            %d created, %d at peak\n", res.InstancesCreated, res.PeakInstances)
			fmt.Fprintf(out, "lower bound          %.1f instance-hours, wait 0 (clairvoyant: job time / capacity %d)\n", res.LowerBound/3600, cfg.Autoscaler.CapacityPerInstance)
			fmt.Fprintf(out, "cost / lower bound   %.3f\n", res.CostRatio)
			fmt.Fprintf(out, "whole-instance bound %.1f instance-hours, wait 0 (clairvoyant, whole instances billing boot and deletion); cost / it %.3f\n",
				res.WholeBound/3600, res.WholeCostRatio)
			if len(res.Days) > 1 {
				fmt.Fprintln(out)
				tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
				fmt.Fprintln(tw, "day\t\tjobs\twait p50\tp95\tmax\tinstance-hours\tidle\tcost / bound\t/ whole\t")
				for _, d := range res.Days {
					ratio, whole := "-", "-"
					if d.LowerBound > 0 {
						ratio = fmt.Sprintf("%.3f", d.CostRatio)
					}
					if d.WholeBound > 0 {
						whole = fmt.Sprintf("%.3f", d.WholeCostRatio)
					}
					p50, p95, longest := "-", "-", "-" // no job arrived: no wait to tell
					if d.Jobs > 0 {
						p50, p95, longest = secs(d.WaitP50), secs(d.WaitP95), secs(d.WaitMax)
					}
					fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\t%s\t%.1f\t%.1f\t%s\t%s\t\n", d.Day+1, d.Weekday().String()[:3], d.Jobs,
						p50, p95, longest, d.InstanceSeconds/3600, d.IdleInstanceSecs/3600, ratio, whole)
				}
				tw.Flush()
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&workload, "workload", "workday", "built-in workload: steady, workday, hourly-burst, spiky, varied, scheduled, pipelines or random")
	f.StringVar(&trace, "trace", "", "trace of jobs instead of a workload: CSV (arrival_seconds,duration_seconds[,tags]) or GitLab jobs API JSON")
	f.Float64Var(&hours, "hours", 24, "hours of built-in workload")
	f.IntVar(&days, "days", 0, "days of built-in workload (instead of --hours)")
	f.StringVar(&explain, "explain", "", "print the scaler's decisions of one hour: DAY:HOUR, e.g. 2:02 for the second day's 02:00-03:00")
	f.StringSliceVar(&tagList, "tag-list", nil, "simulate a runner with these tags: only the trace's jobs it would take (every tag of a job among these)")
	f.BoolVar(&runUntagged, "run-untagged", false, "the runner also takes the trace's untagged jobs (default: true without --tag-list, false with it, as GitLab registers runners)")
	f.StringVar(&writeTrace, "write-trace", "", "write the simulated jobs to this CSV trace (arrival_seconds,duration_seconds[,tags])")
	f.StringVar(&configFile, "config", "", "config.toml whose [runners.autoscaler] table configures the scaler")
	f.StringVar(&runner, "runner", "", "name of the [[runners]] entry in --config (default: the first with an autoscaler)")
	f.Uint64Var(&seed, "seed", 1, "seed of the workload, the cloud and the failures")
	f.Float64Var(&jobShare, "job-share", 1, "keep this share of the workload's or trace's jobs, each drawn with the seed (0-1]: a smaller team's traffic of the same shape")
	f.DurationVar(&boot, "boot", 45*time.Second, "mean boot latency of an instance")
	f.DurationVar(&bootStddev, "boot-stddev", 0, "standard deviation of the boot latency (0: fixed; else lognormal)")
	f.DurationVar(&bootMin, "boot-min", 0, "shortest boot latency")
	f.DurationVar(&deleteLatency, "delete-latency", 10*time.Second, "time an instance takes to delete (billed)")
	f.Float64Var(&increaseErr, "increase-error-rate", 0, "probability that a scale-up request fails")
	f.Float64Var(&neverRunning, "never-running-rate", 0, "probability that an instance never boots")
	f.Float64Var(&vanish, "vanish-rate", 0, "probability that an instance vanishes (spot reclaim) some time after booting")
	f.DurationVar(&vanishAfter, "vanish-after", 30*time.Minute, "mean time to vanishing (exponential)")
	f.Float64Var(&readyFail, "ready-failure-rate", 0, "probability that one ready-up attempt fails")
	f.IntVar(&maxSize, "max-size", 0, "quota of the simulated cloud (0: none)")
	f.IntVar(&idleCount, "idle-count", -1, "override idle_count in every policy (-1: as configured)")
	f.IntVar(&capacity, "capacity", 0, "override capacity_per_instance (0: as configured)")
	f.BoolVar(&prediction, "prediction", true, "override the autoscaler's prediction key (default: as configured, on unless set false)")
	f.BoolVar(&packing, "packing", true, "override the autoscaler's packing key (default: as configured, as prediction unless set)")
	f.StringVar(&spare, "prediction-spare", "", "override the autoscaler's prediction_spare key: poisson or measured (default: as configured, poisson unless set)")
	f.BoolVar(&asJSON, "json", false, "print the result as JSON")
	f.StringVar(&plotFile, "plot", "", "write demand, ready slots and instances over time to this SVG file")
	return cmd
}

func secs(s float64) string {
	return time.Duration(s * float64(time.Second)).Round(100 * time.Millisecond).String()
}

// writeSimTrace writes jobs as a CSV trace sim.ReadTrace reads back.
func writeSimTrace(path string, jobs []sim.Job) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	fmt.Fprintln(w, "arrival_seconds,duration_seconds,tags")
	for _, j := range jobs {
		fmt.Fprintf(w, "%.3f,%.3f,%s\n", j.Arrival.Seconds(), j.Duration.Seconds(), j.Tags)
	}
	return errors.Join(w.Flush(), f.Close())
}

// parseExplain reads --explain DAY:HOUR (day 1 is the first) as the
// hour's start since the run's start.
func parseExplain(v string) (time.Duration, error) {
	d, h, ok := strings.Cut(v, ":")
	day, err1 := strconv.Atoi(d)
	hour, err2 := strconv.Atoi(h)
	if !ok || err1 != nil || err2 != nil || day < 1 || hour < 0 || hour > 23 {
		return 0, fmt.Errorf("--explain %q: want DAY:HOUR, day from 1, hour 0-23 (2:02 is the second day's 02:00-03:00)", v)
	}
	return time.Duration(day-1)*24*time.Hour + time.Duration(hour)*time.Hour, nil
}

// traceTags are a trace job's comma-separated tags, without blanks.
func traceTags(s string) []string {
	var tags []string
	for t := range strings.SplitSeq(s, ",") {
		if t = strings.TrimSpace(t); t != "" {
			tags = append(tags, t)
		}
	}
	return tags
}

// describeTags is how --tag-list and --run-untagged read in a message.
func describeTags(tags map[string]bool, runUntagged bool) string {
	names := slices.Sorted(maps.Keys(tags))
	var b strings.Builder
	if len(names) > 0 {
		b.WriteString("tags " + strings.Join(names, ", "))
	} else {
		b.WriteString("no tags")
	}
	if runUntagged {
		b.WriteString("; untagged jobs too")
	} else {
		b.WriteString("; no untagged jobs")
	}
	return b.String()
}

// warningTally counts the simulated scaler's warnings and errors by
// message, keeping the first of each with its attributes: a run with
// failure flags warns thousands of times, and advice on the configuration
// (boots that outlast idle_time) should not drown in them.
type warningTally struct {
	mu    sync.Mutex
	order []string
	count map[string]int
	first map[string]string
}

func (t *warningTally) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (t *warningTally) Handle(_ context.Context, r slog.Record) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.count == nil {
		t.count, t.first = map[string]int{}, map[string]string{}
	}
	if t.count[r.Message] == 0 {
		t.order = append(t.order, r.Message)
		var attrs []string
		r.Attrs(func(a slog.Attr) bool {
			attrs = append(attrs, a.Key+"="+a.Value.String())
			return true
		})
		t.first[r.Message] = strings.Join(attrs, " ")
	}
	t.count[r.Message]++
	return nil
}

func (t *warningTally) WithAttrs([]slog.Attr) slog.Handler { return t }
func (t *warningTally) WithGroup(string) slog.Handler      { return t }

// print writes one line per message, in the order they first came: how
// many times, the message, and the first one's attributes.
func (t *warningTally) print(w io.Writer) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, m := range t.order {
		fmt.Fprintf(w, "berth sim: the scaler warned %d× %q (first: %s)\n", t.count[m], m, t.first[m])
	}
}
