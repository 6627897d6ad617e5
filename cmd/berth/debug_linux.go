package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/berthci/berth/guest"
	"github.com/berthci/berth/nesting/qemu"
)

func newDebugCmd() *cobra.Command {
	var (
		af      adminFlags
		list    bool
		project int64
		command string
		asJSON  bool
		keep    bool
		bundle  string
	)
	cmd := &cobra.Command{
		Use:   "debug JOB_ID",
		Short: "Restore a failed job's VM snapshot on this machine and open a shell in it (project maintainers)",
		Long: `A job that ran in a microVM with BERTH_SNAPSHOT=on_failure left a snapshot of its VM when its
script failed (docs/snapshots.md). berth debug fetches it from the coordinator (an admin's
token, or with --token a user's who maintains the job's project: it holds what the job had in
memory), restores the VM here under QEMU (TCG when there is
no KVM) and runs a shell in the job's working directory with the job's
environment (masked and file variables left out): the files, processes and memory are as they
were when the script failed. The VM goes when the shell exits.

  berth debug --list            the snapshots the coordinator has
  berth debug 42                a shell in job 42's VM
  berth debug 42 -c 'cat log'   one command; exits with its status
  berth debug --bundle FILE     a snapshot berth run saved (it prints the path)`,
		Args: func(cmd *cobra.Command, args []string) error {
			if list || bundle != "" {
				return cobra.NoArgs(cmd, args)
			}
			return cobra.ExactArgs(1)(cmd, args)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if bundle != "" {
				return debugBundleFile(ctx, cmd, bundle, command, keep)
			}
			c, err := af.client()
			if err != nil {
				return err
			}
			if list {
				snaps, err := c.Snapshots(ctx, project)
				if err != nil {
					return err
				}
				if asJSON {
					return json.NewEncoder(cmd.OutOrStdout()).Encode(snaps)
				}
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "JOB\tNAME\tPROJECT\tPIPELINE\tSIZE\tTAKEN\tEXPIRES")
				for _, s := range snaps {
					fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\t%s\n", s.JobID, s.JobName, s.ProjectPath, s.PipelineID, mib(s.Size),
						s.CreatedAt.Local().Format(time.DateTime), expires(s.ExpireAt))
				}
				return tw.Flush()
			}
			id, err := parseID(args[0])
			if err != nil {
				return err
			}
			progress := cmd.ErrOrStderr()
			fmt.Fprintf(progress, "berth debug: fetching the snapshot of job %d...\n", id)
			began := time.Now()
			pr, pw := io.Pipe()
			fetched := make(chan error, 1)
			var size int64
			go func() {
				n, err := c.Snapshot(ctx, id, &progressWriter{w: pw, out: progress, every: 2 * time.Second, last: time.Now()})
				size = n
				pw.CloseWithError(err)
				fetched <- err
			}()
			dir, meta, done, err := unpack(cmd, pr, keep)
			pr.CloseWithError(errors.New("berth debug: stopped reading"))
			if err == nil {
				defer done()
			}
			if ferr := <-fetched; ferr != nil {
				return ferr
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(progress, "berth debug: %s in %s\n", mib(size), time.Since(began).Round(100*time.Millisecond))
			return debugRestored(ctx, cmd, dir, meta, command)
		},
	}
	af.register(cmd)
	af.registerUserToken(cmd, "a maintainer of the job's project")
	f := cmd.Flags()
	f.BoolVar(&list, "list", false, "list the snapshots the coordinator has")
	f.Int64Var(&project, "project", 0, "with --list: only this project's")
	f.BoolVar(&asJSON, "json", false, "with --list: print JSON")
	f.StringVarP(&command, "command", "c", "", "run this command in the job's directory and environment instead of a shell")
	f.BoolVar(&keep, "keep", false, "keep the snapshot's files (printed) instead of removing them at the end")
	f.StringVar(&bundle, "bundle", "", "restore this snapshot file (what berth run saved) instead of fetching one")
	return cmd
}

// debugBundleFile restores a snapshot file.
func debugBundleFile(ctx context.Context, cmd *cobra.Command, file, command string, keep bool) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	dir, meta, done, err := unpack(cmd, f, keep)
	if err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	defer done()
	return debugRestored(ctx, cmd, dir, meta, command)
}

// unpack reads a bundle into a new temporary directory; done removes it
// (unless keep: its path is printed instead). On error nothing is left.
func unpack(cmd *cobra.Command, r io.Reader, keep bool) (dir string, meta qemu.BundleMeta, done func(), err error) {
	if dir, err = os.MkdirTemp("", "bdbg"); err != nil {
		return "", meta, nil, err
	}
	if meta, err = qemu.ReadBundle(r, dir); err != nil {
		os.RemoveAll(dir)
		return "", meta, nil, err
	}
	if keep {
		fmt.Fprintf(cmd.ErrOrStderr(), "berth debug: the snapshot's files stay in %s\n", dir)
		return dir, meta, func() {}, nil
	}
	return dir, meta, func() { os.RemoveAll(dir) }, nil
}

// debugRestored restores the bundle unpacked in dir and runs the shell
// or command in it.
func debugRestored(ctx context.Context, cmd *cobra.Command, dir string, meta qemu.BundleMeta, command string) error {
	progress := cmd.ErrOrStderr()
	fmt.Fprintf(progress, "berth debug: restoring VM %s (%s, %d MiB, %s)...\n", meta.VM, meta.Image, meta.MemoryMB, meta.Accel)
	began := time.Now()
	log := slog.New(slog.NewTextHandler(progress, &slog.HandlerOptions{Level: slog.LevelWarn}))
	vm, err := qemu.RestoreBundle(ctx, dir, meta, qemu.RestoreOptions{Logger: log})
	if err != nil {
		return err
	}
	defer vm.Close()
	fmt.Fprintf(progress, "berth debug: job %d (%s) as it was when %s, restored in %s; in %s\n", meta.Job.ID, meta.Job.Name,
		pointWords(meta.Job.Point), time.Since(began).Round(100*time.Millisecond), meta.Job.Dir)
	return debugShell(ctx, vm, meta, command, cmd)
}

// debugShell runs the shell, or command, in the restored VM, and returns
// its exit status as the command's.
func debugShell(ctx context.Context, vm *qemu.RestoredVM, meta qemu.BundleMeta, command string, cmd *cobra.Command) error {
	shell := "/bin/sh"
	if meta.Job.Shell == "bash" {
		shell = "/bin/bash"
	}
	o := guest.RunOptions{Dir: meta.Job.Dir, Env: meta.Job.Env, Output: cmd.OutOrStdout(), Detached: true}
	if command != "" {
		o.Argv = []string{shell, "-c", command}
	} else {
		o.Argv = []string{shell}
		if fi, err := os.Stdin.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			o.Argv = append(o.Argv, "-i") // prompts; there is no terminal in the VM
		}
		o.StdinStream = cmd.InOrStdin()
	}
	err := vm.Agent.Run(ctx, o)
	var ee *guest.ExitError
	if errors.As(err, &ee) {
		return &exitError{code: ee.Code, err: fmt.Errorf("exit status %d", ee.Code)}
	}
	return err
}

// progressWriter says every so often how much went through it.
type progressWriter struct {
	w     io.Writer
	out   io.Writer
	n     int64
	every time.Duration
	last  time.Time
}

func (p *progressWriter) Write(b []byte) (int, error) {
	n, err := p.w.Write(b)
	p.n += int64(n)
	if time.Since(p.last) >= p.every {
		p.last = time.Now()
		fmt.Fprintf(p.out, "berth debug: %s fetched\n", mib(p.n))
	}
	return n, err
}

func pointWords(p string) string {
	if p == "on_failure" {
		return "its script failed"
	}
	return "snapshotted at " + strconv.Quote(p)
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

func expires(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return t.Local().Format(time.DateTime)
}
