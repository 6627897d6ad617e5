package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/berthci/berth/bench"
	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/executor/custom"
	"github.com/berthci/berth/executor/docker"
	"github.com/berthci/berth/executor/plugin"
	"github.com/berthci/berth/executor/shell"
	"github.com/berthci/berth/executor/ssh"
	"github.com/berthci/berth/fleeting/plugins/local"
	"github.com/berthci/berth/runner/config"
)

func newBenchCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "bench", Short: "Measure Berth's components and print figures"}
	cmd.AddCommand(newBenchDispatchCmd(), newBenchExecutorsCmd(), newBenchAutoscaleCmd(), newBenchMicroVMCmd(), newBenchRunCmd())
	return cmd
}

func newBenchDispatchCmd() *cobra.Command {
	var (
		o                        bench.DispatchOptions
		push                     bool
		asJSON                   bool
		cpuProfile, allocProfile string
	)
	cmd := &cobra.Command{
		Use:   "dispatch",
		Short: "Dispatch throughput and pickup latency of an in-process coordinator over loopback HTTP",
		Long: `Runners held in the coordinator (long polls of jobs/request) take jobs enqueued in bulk
(throughput) and one at a time, or --burst at a time (pickup latency: from each job's enqueue to
its acknowledgement). A runner manager has room for --capacity jobs, which end as soon as they
are acknowledged; long polling, it holds --request-concurrency polls and polls again as soon as a
poll brought a job, as GitLab's runner does.

--push runs the same workload twice in one run, on fresh coordinators: first with the runners
long polling, then with each runner holding a job push stream (docs/push.md), and prints both.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Progress = cmd.ErrOrStderr()
			// The coordinators run here as in berth server, with its heap floor.
			gc, err := startGCTuner()
			if err != nil {
				return err
			}
			defer gc.Stop()
			channels := []bool{false}
			if push {
				channels = []bool{false, true}
			}
			var results []*bench.DispatchResult
			for i, p := range channels {
				o.Push = p
				if i == len(channels)-1 {
					// The last run's throughput phase (with --push, the
					// push channel's).
					for _, p := range []struct {
						path string
						dst  *io.Writer
					}{{cpuProfile, &o.CPUProfile}, {allocProfile, &o.AllocProfile}} {
						if p.path == "" {
							continue
						}
						f, err := os.Create(p.path)
						if err != nil {
							return err
						}
						defer f.Close()
						*p.dst = f
					}
				}
				res, err := bench.Dispatch(cmd.Context(), o)
				if err != nil {
					return err
				}
				results = append(results, res)
			}
			if asJSON {
				if !push {
					return json.NewEncoder(cmd.OutOrStdout()).Encode(results[0])
				}
				return json.NewEncoder(cmd.OutOrStdout()).Encode(map[string]*bench.DispatchResult{
					bench.ChannelLongPoll: results[0], bench.ChannelPush: results[1]})
			}
			out := cmd.OutOrStdout()
			for i, res := range results {
				if i > 0 {
					fmt.Fprintln(out)
				}
				fmt.Fprintf(out, "channel        %s\n", res.Channel)
				if res.Cells > 1 {
					fmt.Fprintf(out, "cells          %d behind a berth router, %s each\n", res.Cells, res.Store)
				} else {
					fmt.Fprintf(out, "store          %s, %d replica(s)\n", res.Store, res.Replicas)
				}
				fmt.Fprintf(out, "runners        %d, room for %d job(s) each", res.Runners, res.Capacity)
				if res.RequestConcurrency > 0 {
					fmt.Fprintf(out, ", %d long poll(s) held each", res.RequestConcurrency)
				}
				fmt.Fprintln(out)
				if res.RTTMs > 0 {
					fmt.Fprintf(out, "network        %.1f ms round trip between runners and coordinator\n", res.RTTMs)
				}
				fmt.Fprintf(out, "cpus           %d\n", res.CPUs)
				fmt.Fprintf(out, "jobs           %d in %.2fs\n", res.Jobs, res.Seconds)
				fmt.Fprintf(out, "throughput     %.0f jobs/s\n", res.JobsPerSecond)
				if res.CPUMsPerJob > 0 {
					fmt.Fprintf(out, "cpu per job    %.2f ms (the whole process: coordinator and runners)\n", res.CPUMsPerJob)
				}
				if res.LatencyJobs > 0 {
					fmt.Fprintf(out, "pickup (%d, bursts of %d)  p50 %.2f ms  p99 %.2f ms  max %.2f ms\n", res.LatencyJobs, res.Burst, res.PickupP50Ms, res.PickupP99Ms, res.PickupMaxMs)
				}
				if res.CrossPickups > 0 {
					fmt.Fprintf(out, "cross-replica pickup (%d)  p50 %.2f ms  p99 %.2f ms\n", res.CrossPickups, res.CrossPickupP50Ms, res.CrossPickupP99Ms)
				}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.Runners, "runners", 100, "runner managers (long polls, or push streams)")
	f.IntVar(&o.Jobs, "jobs", 10000, "jobs for the throughput phase")
	f.IntVar(&o.LatencyJobs, "latency-jobs", 1000, "jobs enqueued one at a time for the pickup latency phase")
	f.IntVar(&o.Enqueuers, "enqueuers", 4, "goroutines enqueueing in the throughput phase")
	f.IntVar(&o.Capacity, "capacity", 1, "jobs each runner manager runs at once (a push stream announces it; a long-polling manager polls again while it has room)")
	f.IntVar(&o.RequestConcurrency, "request-concurrency", 1, "long polls each runner manager holds at once (GitLab's request_concurrency; default 1, as GitLab's)")
	f.IntVar(&o.Burst, "burst", 1, "jobs the latency phase enqueues at a time (pickup of each from its own enqueue)")
	f.DurationVar(&o.RTT, "rtt", 0, "network round trip between the runners and the coordinator (a delay line of half of it each way on every runner connection; 0: loopback)")
	f.StringVar(&o.Store, "store", "", "postgres:// URL of a database to bench the PostgreSQL store in (a scratch schema is made and dropped; default: SQLite)")
	f.IntVar(&o.Replicas, "replicas", 1, "coordinators sharing the store (PostgreSQL); every other latency job only the other replicas' runners may run, so half the pickups cross replicas")
	f.IntVar(&o.Cells, "cells", 1, "cells (coordinators with SQLite stores of their own) behind a berth router, runners talking to the router")
	f.BoolVar(&push, "push", false, "run the workload with long polling, then with the job push channel, and print both")
	f.BoolVar(&o.PushRESTAck, "push-rest-ack", false, "with --push: acknowledge pushed jobs on REST (PUT /jobs/:id) instead of by the admit on the stream")
	f.BoolVar(&asJSON, "json", false, "print the result as JSON (with --push: {\"long_poll\": …, \"push\": …})")
	f.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the throughput phase to this file (go tool pprof; with --push, the push run's)")
	f.StringVar(&allocProfile, "allocprofile", "", "write the allocation profile at the end of the throughput phase to this file (go tool pprof -sample_index=alloc_space; with --push, the push run's)")
	return cmd
}

func newBenchExecutorsCmd() *cobra.Command {
	var (
		names     []string
		jobs      int
		asJSON    bool
		image     string
		customDir string
		sshHost   string
		sshUser   string
		sshPort   string
		sshKey    string
		sshKnown  string
	)
	cmd := &cobra.Command{
		Use:   "executors",
		Short: "Time from a job handed to an executor to its first script line, and a trivial job's total, per executor",
		Long: `For each executor: N trivial jobs one after the other (after one warm-up job):
Create, Prepare, a first stage printing one line (time to its first byte: what a user
waits for after a runner took the job), six more one-line stages, Cleanup.

Executors: shell; shell-plugin (the shell executor as an executor plugin, out of
process: what the plugin boundary adds); docker (--image, a local image: nothing is pulled); ssh (--ssh-host,
--ssh-user, --ssh-identity, --ssh-known-hosts); custom (--custom-driver, a directory with
config.sh, prepare.sh, run.sh and cleanup.sh such as examples/custom-executor).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			var cases []bench.ExecutorCase
			dir, err := os.MkdirTemp("", "berth-bench-executors-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(dir)
			for _, name := range names {
				c, err := benchExecutorCase(ctx, name, benchExecutorFlags{dir: dir, image: image, customDir: customDir,
					ssh: config.SSH{Host: sshHost, User: sshUser, Port: sshPort, IdentityFile: sshKey, KnownHostsFile: sshKnown}})
				if err != nil {
					return &exitError{code: 2, err: err}
				}
				cases = append(cases, c)
			}
			res := bench.Executors(ctx, cases, jobs, cmd.ErrOrStderr())
			for _, c := range cases {
				bg := context.WithoutCancel(ctx)
				if d, ok := c.Provider.(*docker.Provider); ok {
					_ = d.RemoveVolumes(bg, bench.BenchRunner)
				}
				if s, ok := c.Provider.(executor.Shutdowner); ok {
					_ = s.Shutdown(bg)
				}
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(res)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "EXECUTOR\tJOBS\tFIRST LINE p50\tp95\tSTAGE p50\tJOB p50\tp95")
			failed := false
			for _, r := range res {
				if r.Err != "" {
					failed = true
					fmt.Fprintf(tw, "%s\t%d\terror: %s\n", r.Name, r.Jobs, r.Err)
					continue
				}
				fmt.Fprintf(tw, "%s\t%d\t%.1f ms\t%.1f ms\t%.1f ms\t%.1f ms\t%.1f ms\n", r.Name, r.Jobs, r.FirstLineP50Ms, r.FirstLineP95Ms, r.StageP50Ms, r.JobP50Ms, r.JobP95Ms)
			}
			tw.Flush()
			if failed {
				return &exitError{code: 1, err: errors.New("an executor failed")}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&names, "executors", []string{"shell"}, "executors to measure: shell, shell-plugin (the shell executor out of process), docker, ssh, custom")
	f.IntVar(&jobs, "jobs", 20, "trivial jobs per executor")
	f.BoolVar(&asJSON, "json", false, "print the results as JSON")
	f.StringVar(&image, "image", "", "docker: the (local) image jobs run in")
	f.StringVar(&customDir, "custom-driver", "examples/custom-executor", "custom: directory of the driver's config.sh, prepare.sh, run.sh, cleanup.sh")
	f.StringVar(&sshHost, "ssh-host", "", "ssh: host")
	f.StringVar(&sshPort, "ssh-port", "", "ssh: port (default 22)")
	f.StringVar(&sshUser, "ssh-user", "", "ssh: user")
	f.StringVar(&sshKey, "ssh-identity", "", "ssh: private key file")
	f.StringVar(&sshKnown, "ssh-known-hosts", "", "ssh: known_hosts file (default ~/.ssh/known_hosts)")
	return cmd
}

type benchExecutorFlags struct {
	dir, image, customDir string
	ssh                   config.SSH
}

// benchExecutorCase builds the provider of one executor for berth bench
// executors, as the runner would from config.toml.
func benchExecutorCase(ctx context.Context, name string, f benchExecutorFlags) (bench.ExecutorCase, error) {
	builds, cache := filepath.Join(f.dir, name, "builds"), filepath.Join(f.dir, name, "cache")
	switch name {
	case shell.Name:
		return bench.ExecutorCase{Name: name, Provider: shell.New(shell.Config{DefaultBuildsDir: builds, DefaultCacheDir: cache})}, nil
	case docker.Name:
		if f.image == "" {
			return bench.ExecutorCase{}, errors.New("docker: --image is required (a local image: nothing is pulled)")
		}
		p, err := docker.New(ctx, docker.Options{Config: config.Docker{Image: f.image, PullPolicy: config.StringList{config.PullIfNotPresent}}})
		if err != nil {
			return bench.ExecutorCase{}, err
		}
		return bench.ExecutorCase{Name: name, Provider: p}, nil
	case ssh.Name:
		if f.ssh.Host == "" {
			return bench.ExecutorCase{}, errors.New("ssh: --ssh-host is required")
		}
		p, err := ssh.New(ssh.Options{Config: f.ssh})
		if err != nil {
			return bench.ExecutorCase{}, err
		}
		return bench.ExecutorCase{Name: name, Provider: p}, nil
	case custom.Name:
		d, err := filepath.Abs(f.customDir)
		if err != nil {
			return bench.ExecutorCase{}, err
		}
		p, err := custom.New(custom.Options{BuildsDir: builds, CacheDir: cache, Config: config.Custom{
			ConfigExec: filepath.Join(d, "config.sh"), PrepareExec: filepath.Join(d, "prepare.sh"),
			RunExec: filepath.Join(d, "run.sh"), CleanupExec: filepath.Join(d, "cleanup.sh")}})
		if err != nil {
			return bench.ExecutorCase{}, err
		}
		return bench.ExecutorCase{Name: name, Provider: p}, nil
	case "shell-plugin":
		// The shell executor out of process, as executor = "plugin" with
		// [runners.plugin] name = "shell" runs it.
		p, err := plugin.New(ctx, plugin.Options{Config: config.Plugin{Name: shell.Name}, Builtin: builtinPlugin, HostVersion: version})
		if err != nil {
			return bench.ExecutorCase{}, err
		}
		return bench.ExecutorCase{Name: name, Provider: p, BuildsDir: builds, CacheDir: cache}, nil
	}
	return bench.ExecutorCase{}, fmt.Errorf("--executors: %q is not one of shell, shell-plugin, docker, ssh, custom", name)
}

func newBenchAutoscaleCmd() *cobra.Command {
	var (
		warm, cold int
		asJSON     bool
	)
	cmd := &cobra.Command{
		Use:   "autoscale",
		Short: "Time from a job's enqueue to its first script line on an autoscaled instance, warm and cold",
		Long: `An embedded coordinator, a runner manager and its autoscaler with the instance executor on
the local fleeting plugin (instances are SSH servers of Berth's own on this machine). Each
job's first script line writes the time; the figure is that time minus the enqueue.

warm: one idle slot is kept ready (idle_count 1) on an instance that already has the helper.
cold: the fleet is empty before each job (idle_count 0): the instance is created, readied
and gets the helper. Jobs skip the git checkout (GIT_STRATEGY none).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dir, err := os.MkdirTemp("", "berth-bench-autoscale-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(dir)
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			g := local.New(local.Config{StateDir: filepath.Join(dir, "fleeting"), Name: "bench", MaxInstances: 4,
				ServerArgv: []string{exe, "fleeting-plugin", "local", local.ServerCommand}})
			res, err := bench.Autoscale(cmd.Context(), bench.AutoscaleOptions{Group: g, Dir: dir, WarmJobs: warm, ColdJobs: cold, Progress: cmd.ErrOrStderr()})
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(res)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "PHASE\tJOBS\tENQUEUE TO FIRST LINE p50\tp95\tmax")
			for _, r := range res {
				fmt.Fprintf(tw, "%s\t%d\t%.1f ms\t%.1f ms\t%.1f ms\n", r.Phase, r.Jobs, r.P50Ms, r.P95Ms, r.MaxMs)
			}
			return tw.Flush()
		},
	}
	f := cmd.Flags()
	f.IntVar(&warm, "jobs", 20, "jobs measured on a warm idle slot")
	f.IntVar(&cold, "cold-jobs", 3, "jobs measured from an empty fleet")
	f.BoolVar(&asJSON, "json", false, "print the results as JSON")
	return cmd
}
