package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/berthci/berth/bench"
	"github.com/berthci/berth/executor"
	econfig "github.com/berthci/berth/executor/config"
	"github.com/berthci/berth/executor/microvm"
	"github.com/berthci/berth/nesting"
	"github.com/berthci/berth/nesting/qemu"
	"github.com/berthci/berth/runnerapi"
)

// microVMBenchRow is one accelerator's figures, or why it was not
// measured.
type microVMBenchRow struct {
	Accel string `json:"accel"`
	// Start is cold (every VM boots) or warm (restored from the image's
	// template, made by the warm-up job).
	Start string `json:"start"`
	bench.ExecutorResult
	MemoryMB int    `json:"guest_memory_mb"`
	Skipped  string `json:"skipped,omitempty"`
}

func newBenchMicroVMCmd() *cobra.Command {
	var (
		image    string
		jobs     int
		memoryMB int
		accels   []string
		starts   []string
		asJSON   bool
		matrix   bench.MatrixOptions
	)
	cmd := &cobra.Command{
		Use:   "microvm",
		Short: "Time a microVM job's boot and first script line, and a VM's memory, per accelerator",
		Long: `Trivial jobs (after one warm-up job) on the microvm executor with its own nesting daemon on
QEMU, one VM per job, as a runner with executor = "microvm" runs them. Per accelerator:

  START       cold: every VM boots; warm: every VM is restored from its image's template
              (a snapshot of a booted VM, made during the warm-up job)
  BOOT        from asking the nesting daemon for a VM to its guest agent's first answer
  FIRST LINE  from the job handed to the executor to the first byte of its first script
  JOB         a trivial job's total: prepare, seven one-line stages, the VM deleted
  RSS         the QEMU process's resident memory once the job runs (the guest has --memory-mb)

tcg is QEMU's emulator (works everywhere); kvm is measured when a KVM probe VM boots here
(/dev/kvm being there is not enough: nested KVM can hang), and reported as skipped with the
probe's answer otherwise. Needs root, QEMU, a kernel in /boot and the image in the local Docker
engine (converted once into the VM image cache).

With --matrix N, it also runs a parallel:matrix of N microVM jobs with berth run, unbranched and
then branched (BERTH_MATRIX_BRANCH: the common prefix runs once, the other jobs start from a
branch of its VM), after a warm-up run: before_script hashes --prefix-mib MiB (CPU-bound, like a
build step), each script prints a result line; it prints both times and whether every job's result
was the same both ways. --start none skips the per-accelerator table.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if image == "" {
				return &exitError{code: 2, err: errors.New("--image is required: a local Docker image (it is converted, not pulled)")}
			}
			if _, why := runMicroVMCheck(); why != "" {
				return &exitError{code: 2, err: errors.New(why)}
			}
			ctx := cmd.Context()
			progress := cmd.ErrOrStderr()
			if len(starts) == 1 && starts[0] == "none" {
				starts = nil
			}
			for _, st := range starts {
				if st != "cold" && st != "warm" {
					return &exitError{code: 2, err: fmt.Errorf("--start %q: want cold, warm or none", st)}
				}
			}
			if matrix.Jobs < 0 || matrix.Jobs == 1 {
				return &exitError{code: 2, err: fmt.Errorf("--matrix %d: want 0 (none) or at least 2 jobs", matrix.Jobs)}
			}
			var rows []microVMBenchRow
			for _, accel := range accels {
				if len(starts) == 0 {
					break
				}
				for _, st := range starts {
					row, err := benchMicroVM(ctx, accel, st, image, jobs, memoryMB, progress)
					if err != nil {
						return err
					}
					rows = append(rows, row)
					if row.Skipped != "" {
						break
					}
				}
			}
			var mres *bench.MatrixResult
			if matrix.Jobs > 0 {
				self, err := os.Executable()
				if err != nil {
					return err
				}
				matrix.Berth, matrix.Image, matrix.Progress = self, image, progress
				if mres, err = bench.Matrix(ctx, matrix); err != nil {
					return err
				}
			}
			if asJSON {
				if mres != nil {
					return json.NewEncoder(cmd.OutOrStdout()).Encode(struct {
						Starts []microVMBenchRow   `json:"starts"`
						Matrix *bench.MatrixResult `json:"matrix"`
					}{rows, mres})
				}
				return json.NewEncoder(cmd.OutOrStdout()).Encode(rows)
			}
			if mres != nil {
				defer printMatrix(cmd.OutOrStdout(), mres)
			}
			if len(rows) == 0 {
				return nil
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ACCEL\tSTART\tJOBS\tBOOT p50\tFIRST LINE p50\tp95\tSTAGE p50\tJOB p50\tRSS p50 (guest memory)")
			failed := false
			for _, r := range rows {
				switch {
				case r.Skipped != "":
					fmt.Fprintf(tw, "%s\t-\t-\tskipped: %s\n", r.Accel, r.Skipped)
				case r.Err != "":
					failed = true
					fmt.Fprintf(tw, "%s\t%s\t%d\terror: %s\n", r.Accel, r.Start, r.Jobs, r.Err)
				default:
					fmt.Fprintf(tw, "%s\t%s\t%d\t%.0f ms\t%.0f ms\t%.0f ms\t%.1f ms\t%.0f ms\t%.0f MiB (%d MiB)\n", r.Accel, r.Start, r.Jobs, r.BootP50Ms,
						r.FirstLineP50Ms, r.FirstLineP95Ms, r.StageP50Ms, r.JobP50Ms, r.RSSP50MiB, r.MemoryMB)
				}
			}
			tw.Flush()
			for _, line := range warmSpeedups(rows) {
				fmt.Fprintln(cmd.OutOrStdout(), line)
			}
			if failed {
				return &exitError{code: 1, err: errors.New("a benchmark failed")}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&image, "image", "", "the jobs' image: a local Docker image (required)")
	f.IntVar(&jobs, "jobs", 3, "trivial jobs per accelerator")
	f.IntVar(&memoryMB, "memory-mb", 512, "each VM's memory")
	f.StringSliceVar(&accels, "accel", []string{qemu.AccelTCG, qemu.AccelKVM}, "accelerators to measure: tcg, kvm")
	f.StringSliceVar(&starts, "start", []string{"cold", "warm"}, "how VMs start: cold (booted), warm (restored from the image's template)")
	f.BoolVar(&asJSON, "json", false, "print the results as JSON")
	f.IntVar(&matrix.Jobs, "matrix", 0, "also time a parallel:matrix of this many jobs, branched vs unbranched (0: no)")
	f.IntVar(&matrix.PrefixMiB, "prefix-mib", 64, "with --matrix: MiB the common before_script hashes")
	f.IntVar(&matrix.Concurrency, "concurrency", 0, "with --matrix: berth run's --concurrency (default: its own, the number of CPUs)")
	return cmd
}

// printMatrix prints the branched-vs-unbranched comparison.
func printMatrix(w io.Writer, m *bench.MatrixResult) {
	fmt.Fprintf(w, "parallel:matrix of %d microVM jobs, before_script hashing %d MiB:\n", m.Jobs, m.PrefixMiB)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN\tPIPELINE\tJOBS FROM THE BRANCH POINT")
	fmt.Fprintf(tw, "unbranched\t%.1f s\t%d\n", m.Unbranched.Seconds, m.Unbranched.Resumed)
	fmt.Fprintf(tw, "branched\t%.1f s\t%d\n", m.Branched.Seconds, m.Branched.Resumed)
	tw.Flush()
	same := "identical"
	if !m.Identical {
		same = "DIFFERENT"
	}
	fmt.Fprintf(w, "branched finishes %.2f× sooner (the prefix took %.1f s in the job that ran it); job results %s both ways\n", m.Speedup, m.Branched.PrefixSeconds, same)
}

// warmSpeedups compares, per accelerator, the warm start's first line
// with the cold one's.
func warmSpeedups(rows []microVMBenchRow) []string {
	var out []string
	for _, cold := range rows {
		if cold.Start != "cold" || cold.Err != "" || cold.Skipped != "" {
			continue
		}
		for _, warm := range rows {
			if warm.Accel == cold.Accel && warm.Start == "warm" && warm.Err == "" && warm.Skipped == "" && warm.FirstLineP50Ms > 0 {
				out = append(out, fmt.Sprintf("%s: a warm start reaches the first script line %.1f× sooner than a cold boot (%.0f ms vs %.0f ms)",
					cold.Accel, cold.FirstLineP50Ms/warm.FirstLineP50Ms, warm.FirstLineP50Ms, cold.FirstLineP50Ms))
			}
		}
	}
	return out
}

// benchMicroVM measures one accelerator, VMs starting cold or warm.
func benchMicroVM(ctx context.Context, accel, start, image string, jobs, memoryMB int, progress io.Writer) (microVMBenchRow, error) {
	row := microVMBenchRow{Accel: accel, Start: start, MemoryMB: memoryMB}
	if accel != qemu.AccelTCG && accel != qemu.AccelKVM {
		return row, &exitError{code: 2, err: fmt.Errorf("--accel %q: want tcg or kvm", accel)}
	}
	state, err := os.MkdirTemp("", "berth-bench-vm-")
	if err != nil {
		return row, err
	}
	defer os.RemoveAll(state)
	log := slog.New(slog.DiscardHandler)
	if accel == qemu.AccelKVM {
		// Only a VM that boots under KVM says KVM works here.
		h := qemu.New(log)
		if err := h.Init(ctx, []byte(fmt.Sprintf(`{"accel": "auto", "state_dir": %q}`, state))); err != nil {
			return row, err
		}
		got, why := h.Accel()
		h.Shutdown(context.WithoutCancel(ctx))
		if got != qemu.AccelKVM {
			row.Skipped = why
			return row, nil
		}
	}
	var hv *qemu.Hypervisor
	p, err := microvm.New(microvm.Options{
		Config:     econfig.MicroVM{NestingConfig: map[string]any{"accel": accel, "state_dir": state, "memory_mb": memoryMB, "warm_start": start == "warm"}},
		Hypervisor: func(l *slog.Logger) nesting.Hypervisor { hv = qemu.New(l); return hv },
		StateDir:   state, Logger: log,
	})
	if err != nil {
		return row, err
	}
	defer p.Shutdown(context.WithoutCancel(ctx))
	c := bench.ExecutorCase{Name: "microvm/" + accel + "/" + start, Provider: p, Job: &runnerapi.JobResponse{Image: &runnerapi.Image{Name: image}},
		Inspect: func(ex executor.Executor) (bench.Inspection, error) {
			e, ok := ex.(*microvm.Executor)
			if !ok {
				return bench.Inspection{}, fmt.Errorf("not a microvm executor: %T", ex)
			}
			pid, ok := hv.PID(e.VM().ID)
			if !ok {
				return bench.Inspection{}, fmt.Errorf("VM %s: no QEMU", e.VM().ID)
			}
			rss, err := residentBytes(pid)
			return bench.Inspection{Boot: e.BootTime(), RSS: rss}, err
		}}
	fmt.Fprintf(progress, "bench microvm: %s %s: %d jobs after a warm-up job (converts %s on first use)\n", accel, start, jobs, image)
	began := time.Now()
	row.ExecutorResult = bench.Executors(ctx, []bench.ExecutorCase{c}, jobs, progress)[0]
	fmt.Fprintf(progress, "bench microvm: %s %s took %v\n", accel, start, time.Since(began).Round(time.Second))
	return row, nil
}

// residentBytes is VmRSS of process pid.
func residentBytes(pid int) (int64, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmRSS for pid %d", pid)
}
