package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/berthci/berth/coordinator/pipelines"
	"github.com/berthci/berth/local"
)

func newRunCmd() *cobra.Command {
	var (
		jobs, vars  []string
		executor    string
		dockerImage string
		asJSON      bool
		concurrency int
		ref, source string
		logLevel    string
		timings     bool
		fresh       bool
		ui          bool
		uiListen    string
	)
	cmd := &cobra.Command{
		Use:   "run [DIR]",
		Short: "Run the pipeline of DIR/.gitlab-ci.yml on this machine (embedded coordinator and runner)",
		Long: `Run the pipeline of DIR/.gitlab-ci.yml (default: the current directory) on this machine.

An embedded coordinator (temporary data directory, on loopback) and an embedded runner
run it with full semantics: stages and needs, artifacts and cache between
jobs, rules, parallel and matrix jobs, after_script, allow_failure, retry. Every job's log is
streamed prefixed by the job's name; a summary table follows. Manual jobs are not played.

Executors: by default a job that names an image: runs in it (the docker executor, services
included) when a Docker engine is reachable, and every other job in the shell on this
machine; images are used as they are locally (pull_policy if-not-present). Without Docker,
jobs with image: run in the shell and the run says so once. --executor shell runs every job
in the shell; --executor docker every job in a container (--docker-image for jobs without
image:). A job asking for isolation microvm runs in a microVM of its image (QEMU, KVM when it
works, else emulation), when berth run is root with QEMU, a kernel in /boot and Docker.

With --ui the coordinator's web UI is served on loopback for the run: berth run prints
a link that signs the browser in once (within 15 minutes) and opens the pipeline, with
its jobs' logs streaming; when the pipeline is done the UI stays up until Ctrl-C.

Exit status: 0 if the pipeline succeeded, 1 if it failed or was canceled, 2 on a usage or
setup error.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir := "."
			if len(args) == 1 {
				dir = args[0]
			}
			if !slices.Contains(pipelines.Sources, source) {
				return &exitError{code: 2, err: fmt.Errorf("--source %q: want one of %s", source, strings.Join(pipelines.Sources, ", "))}
			}
			opts := local.Options{Dir: dir, Jobs: jobs, Executor: executor, DockerImage: dockerImage, Concurrency: concurrency, Ref: ref, Source: source, Version: version, Timings: timings}
			for _, kv := range vars {
				k, v, ok := strings.Cut(kv, "=")
				if !ok || k == "" {
					return &exitError{code: 2, err: fmt.Errorf("--var %q: want KEY=VALUE", kv)}
				}
				opts.Variables = append(opts.Variables, pipelines.PipelineVariable{Key: k, Value: v})
			}
			if !fresh {
				// Build directories are kept per pipeline directory.
				if abs, err := filepath.Abs(dir); err == nil {
					if cache, err := os.UserCacheDir(); err == nil {
						opts.KeepDir = local.KeepDir(filepath.Join(cache, "berth", "run"), abs)
					}
				}
			}
			var lv slog.Level
			if err := lv.UnmarshalText([]byte(logLevel)); err != nil {
				return &exitError{code: 2, err: fmt.Errorf("--log-level %q: want debug, info, warn or error", logLevel)}
			}
			opts.Logger = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: lv}))
			stdout, stderr := cmd.OutOrStdout(), cmd.ErrOrStderr()
			opts.Logs, opts.Warnings = stdout, stderr
			if asJSON {
				opts.Logs = stderr // stdout carries only the result
			}
			opts.TTY = isTerminal(opts.Logs)
			if isTerminal(stderr) {
				opts.Progress = stderr
			}
			if cache, err := os.UserCacheDir(); err == nil {
				opts.SnapshotDir = filepath.Join(cache, "berth", "snapshots")
			}
			if executor == "" {
				vm, why := runMicroVM(opts.Logger)
				if vm != nil {
					// It is this command's: stopped (its VMs deleted,
					// its directory removed) however the run ends.
					defer vm.Shutdown(context.WithoutCancel(cmd.Context()))
					opts.MicroVM = vm
				}
				opts.MicroVMUnavailable = why
			}
			printed := false
			printResult := func(res *local.Result) {
				if asJSON {
					_ = json.NewEncoder(stdout).Encode(res)
				} else {
					fmt.Fprintln(stdout)
					local.Summary(stdout, res)
					if res.Timings != nil {
						fmt.Fprintln(stdout)
						local.PrintTimings(stdout, res.Timings)
					}
				}
				printed = true
			}
			if ui || uiListen != "" {
				var url string
				opts.UI = &local.UIOptions{Listen: uiListen,
					Ready: func(u string) {
						url = u[:strings.Index(u, "/-/")]
						fmt.Fprintf(stderr, "web UI: %s\n  (this link signs you in once, within 15 minutes)\n", u)
					},
					Hold: func(ctx context.Context, res *local.Result) {
						printResult(res)
						fmt.Fprintf(stderr, "\nThe pipeline is done; the web UI stays up at %s until Ctrl-C.\n", url)
						<-ctx.Done()
					}}
			}
			res, err := local.Run(cmd.Context(), opts)
			if res == nil {
				code := 2
				if errors.Is(err, cmd.Context().Err()) {
					code = 1
				}
				return &exitError{code: code, err: err}
			}
			if !printed {
				printResult(res)
			}
			if err != nil {
				return &exitError{code: 1, err: err}
			}
			if !res.Succeeded() {
				return &exitError{code: 1, err: fmt.Errorf("pipeline #%d %s", res.PipelineID, res.Status)}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&jobs, "job", nil, "run only this job and what it needs (repeatable)")
	f.StringArrayVar(&vars, "var", nil, "pipeline variable KEY=VALUE (repeatable)")
	f.StringVar(&executor, "executor", "", "shell or docker (default: docker for jobs with image: when Docker is reachable, else shell)")
	f.StringVar(&dockerImage, "docker-image", "", "with --executor docker: the image of jobs without image:")
	f.BoolVar(&asJSON, "json", false, "print a machine-readable result on stdout (job logs go to stderr)")
	f.IntVar(&concurrency, "concurrency", 0, "jobs running at once (default: number of CPUs)")
	f.StringVar(&ref, "ref", "main", "branch the directory is committed to (rules see it as CI_COMMIT_BRANCH)")
	f.StringVar(&source, "source", "push", "the pipeline's CI_PIPELINE_SOURCE, for rules that test it (schedule, web, api, trigger, merge_request_event, …)")
	f.StringVar(&logLevel, "log-level", "warn", "log level of the embedded coordinator and runner")
	f.BoolVar(&fresh, "fresh", false, "start from empty build directories and keep none (default: the shell jobs' checkouts are kept between runs of DIR)")
	f.BoolVar(&timings, "timings", false, "print where the time went: the run's phases, each job's steps and its overhead")
	f.BoolVar(&ui, "ui", false, "serve the web UI on loopback for the run (prints a sign-in link) and keep it up until Ctrl-C")
	f.StringVar(&uiListen, "ui-listen", "", "loopback address of --ui (default 127.0.0.1 and a free port; implies --ui)")
	return cmd
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w any) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
