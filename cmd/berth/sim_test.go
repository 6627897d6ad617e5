package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthci/berth/taskscaler/sim"
)

func runSim(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	cmd := newRootCmd()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(append([]string{"sim"}, args...))
	err = cmd.ExecuteContext(context.Background())
	return out.String(), errOut.String(), err
}

func TestSimPrintsFigures(t *testing.T) {
	out, _, err := runSim(t, "--workload", "steady", "--hours", "1")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"jobs ", "wait ", "p95", "p99", "max", "instance-hours", "idle", "created", "failed acquisitions", "lower bound", "cost / lower bound"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// The random workload says what its seed drew; the others draw nothing
// to say.
func TestSimRandomSaysWhatItDrew(t *testing.T) {
	out, _, err := runSim(t, "--workload", "random", "--seed", "3", "--hours", "1")
	if err != nil {
		t.Fatal(err)
	}
	if want := "drawn                " + sim.Describe("random", 3) + "\n"; !strings.Contains(out, want) {
		t.Fatalf("output lacks %q:\n%s", want, out)
	}
	if out, _, _ := runSim(t, "--workload", "steady", "--hours", "1"); strings.Contains(out, "drawn") {
		t.Fatalf("steady says it drew something:\n%s", out)
	}
	// --json says it too, beside what was run and the figures.
	for _, c := range []struct {
		workload, drawn string
	}{{"random", sim.Describe("random", 3)}, {"steady", ""}} {
		out, _, err := runSim(t, "--workload", c.workload, "--seed", "3", "--hours", "1", "--json")
		if err != nil {
			t.Fatal(err)
		}
		var res struct {
			Workload string  `json:"workload"`
			Seed     uint64  `json:"seed"`
			Drawn    *string `json:"drawn"`
			Jobs     int     `json:"jobs"`
		}
		if err := json.Unmarshal([]byte(out), &res); err != nil {
			t.Fatal(err)
		}
		if res.Workload != c.workload || res.Seed != 3 || res.Jobs == 0 {
			t.Errorf("%s: workload %q, seed %d, %d jobs:\n%s", c.workload, res.Workload, res.Seed, res.Jobs, out)
		}
		switch {
		case res.Drawn == nil && c.drawn != "":
			t.Errorf("%s: no drawn, want %q", c.workload, c.drawn)
		case res.Drawn != nil && *res.Drawn != c.drawn:
			t.Errorf("%s: drawn %q, want %q", c.workload, *res.Drawn, c.drawn)
		}
	}
}

func TestSimJSONDeterministic(t *testing.T) {
	args := []string{"--workload", "hourly-burst", "--hours", "2", "--json", "--seed", "3", "--boot-stddev", "10s", "--ready-failure-rate", "0.1"}
	a, _, err := runSim(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := runSim(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	if a != b {
		t.Fatalf("same inputs, different outputs:\n%s\n%s", a, b)
	}
	var res map[string]any
	if err := json.Unmarshal([]byte(a), &res); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"jobs", "wait_p50_seconds", "wait_p95_seconds", "wait_p99_seconds", "wait_max_seconds", "instance_seconds",
		"idle_instance_seconds", "instances_created", "failed_acquisitions", "lower_bound_instance_seconds", "cost_ratio", "days"} {
		if _, ok := res[k]; !ok {
			t.Errorf("JSON lacks %s: %s", k, a)
		}
	}
	if jobs, _ := res["jobs"].(float64); jobs == 0 {
		t.Errorf("implausible result %v", res)
	}
	if ratio, _ := res["cost_ratio"].(float64); ratio < 1 {
		t.Errorf("implausible result %v", res)
	}
}

func TestSimTraceConfigAndPlot(t *testing.T) {
	dir := t.TempDir()
	trace := filepath.Join(dir, "jobs.csv")
	os.WriteFile(trace, []byte("arrival_seconds,duration_seconds,tags\n0,600,docker\n10,600\n20,600\n3600,60\n"), 0o600)
	config := filepath.Join(dir, "config.toml")
	os.WriteFile(config, []byte(`
[[runners]]
name = "fleet"
executor = "docker-autoscaler"
[runners.autoscaler]
capacity_per_instance = 2
unknown_key = 1
[[runners.autoscaler.policy]]
idle_count = 2
idle_time = "2m"
`), 0o600)
	plot := filepath.Join(dir, "plot.svg")
	out, errOut, err := runSim(t, "--trace", trace, "--config", config, "--plot", plot, "--json")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(errOut, "runners.autoscaler.unknown_key") {
		t.Errorf("unknown key not warned about: %q", errOut)
	}
	var res map[string]any
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	// 1860 s of jobs on 2 slots per instance.
	if res["jobs"] != 4.0 || res["lower_bound_instance_seconds"] != 930.0 {
		t.Errorf("result %v", res)
	}
	svg, err := os.ReadFile(plot)
	if err != nil || !bytes.HasPrefix(svg, []byte("<svg")) {
		t.Fatalf("plot: %v %.40q", err, svg)
	}
}

func TestSimErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--workload", "nope"},
		{"--trace", "/does/not/exist.csv"},
		{"--config", "/does/not/exist.toml"},
		{"--increase-error-rate", "2"},
		{"--days", "2", "--hours", "3"},
		{"--days", "-1"},
	} {
		if _, _, err := runSim(t, args...); err == nil {
			t.Errorf("berth sim %v succeeded", args)
		}
	}
}

// A multi-day run prints a row per day; --write-trace writes the jobs as
// a trace that replays to the same figures.
func TestSimDaysAndWriteTrace(t *testing.T) {
	trace := filepath.Join(t.TempDir(), "varied.csv")
	out, _, err := runSim(t, "--workload", "varied", "--days", "2", "--seed", "4", "--write-trace", trace, "--json")
	if err != nil {
		t.Fatal(err)
	}
	var gen struct {
		Jobs int `json:"jobs"`
		Days []struct {
			Day  int `json:"day"`
			Jobs int `json:"jobs"`
		} `json:"days"`
		WaitP95 float64 `json:"wait_p95_seconds"`
	}
	if err := json.Unmarshal([]byte(out), &gen); err != nil {
		t.Fatal(err)
	}
	if len(gen.Days) != 2 || gen.Days[0].Jobs+gen.Days[1].Jobs != gen.Jobs || gen.Jobs == 0 {
		t.Fatalf("days %+v of %d jobs", gen.Days, gen.Jobs)
	}
	replay, _, err := runSim(t, "--trace", trace, "--seed", "4", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Jobs    int     `json:"jobs"`
		WaitP95 float64 `json:"wait_p95_seconds"`
	}
	if err := json.Unmarshal([]byte(replay), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Jobs != gen.Jobs {
		t.Errorf("the written trace replays %d jobs, want %d", rep.Jobs, gen.Jobs)
	}
	text, _, err := runSim(t, "--workload", "varied", "--days", "2", "--seed", "4")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text, "Mon") || !strings.Contains(text, "Tue") || !strings.Contains(text, "cost / bound") {
		t.Errorf("no per-day table:\n%s", text)
	}
}

// --explain prints the decisions of the chosen hour, stamped with their
// virtual time, and nothing of other hours.
func TestSimExplain(t *testing.T) {
	out, _, err := runSim(t, "--workload", "varied", "--days", "2", "--seed", "3", "--explain", "2:02")
	if err != nil {
		t.Fatal(err)
	}
	_, trace, ok := strings.Cut(out, "decisions of hour 2:02")
	if !ok {
		t.Fatalf("no decisions section:\n%s", out)
	}
	lines := strings.Split(strings.TrimSpace(trace), "\n")[1:]
	if len(lines) == 0 || !strings.Contains(trace, "outcome=scale_up") {
		t.Fatalf("the nightly burst's hour shows no scale-up:\n%s", trace)
	}
	for _, l := range lines {
		if !strings.HasPrefix(l, "Tue 02:") || !strings.Contains(l, " need=") || !strings.Contains(l, " supply=") {
			t.Errorf("line %q: want Tue 02:mm:ss with the figures", l)
		}
	}
	for _, bad := range []string{"0:02", "2:24", "x", "2"} {
		if _, _, err := runSim(t, "--hours", "1", "--explain", bad); err == nil {
			t.Errorf("--explain %q accepted", bad)
		}
	}
}

// --trace reads the JSON of GitLab's jobs API; --write-trace turns it into
// CSV, times from the Monday before the first job; a bad job is named.
func TestSimGitLabJobsTrace(t *testing.T) {
	dir := t.TempDir()
	in, csv := filepath.Join(dir, "jobs.json"), filepath.Join(dir, "jobs.csv")
	// Tuesday 2026-12-01 08:00:00 UTC queued, started 15 s later.
	jobs := `[{"id": 2, "status": "success", "started_at": "2026-12-01T08:00:15Z", "queued_duration": 15, "duration": 120, "tag_list": ["linux"]},
{"id": 1, "status": "manual", "started_at": null, "duration": null}][]`
	if err := os.WriteFile(in, []byte(jobs), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errOut, err := runSim(t, "--trace", in, "--write-trace", csv, "--json")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(errOut, "1 jobs left out (never started, or not finished)") {
		t.Errorf("the manual job left out is not said: %q", errOut)
	}
	var res struct {
		Jobs int `json:"jobs"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || res.Jobs != 1 {
		t.Fatalf("jobs %d (%v), want 1:\n%s", res.Jobs, err, out)
	}
	written, err := os.ReadFile(csv)
	if err != nil {
		t.Fatal(err)
	}
	if want := "115200.000,120.000,linux"; !strings.Contains(string(written), want) { // 1 day 8 h
		t.Errorf("written trace lacks %q:\n%s", want, written)
	}
	if err := os.WriteFile(in, []byte(`[{"id": 5, "started_at": "2026-12-01T08:00:15Z", "duration": -3}]`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := runSim(t, "--trace", in); err == nil || !strings.Contains(err.Error(), "id 5") {
		t.Errorf("a negative duration: %v, want the job named", err)
	}
}

// A trace runs to its last job; --days or --hours take its beginning.
func TestSimTraceDays(t *testing.T) {
	trace := filepath.Join(t.TempDir(), "jobs.csv")
	if err := os.WriteFile(trace, []byte("0,60\n3600,60\n90000,60\n180000,60\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		jobs int
	}{{nil, 4}, {[]string{"--days", "1"}, 2}, {[]string{"--days", "2"}, 3}, {[]string{"--hours", "0.5"}, 1}} {
		out, _, err := runSim(t, append([]string{"--trace", trace, "--json"}, c.args...)...)
		if err != nil {
			t.Fatal(err)
		}
		var res struct {
			Jobs int `json:"jobs"`
		}
		if err := json.Unmarshal([]byte(out), &res); err != nil || res.Jobs != c.jobs {
			t.Errorf("%v: %d jobs (%v), want %d", c.args, res.Jobs, err, c.jobs)
		}
	}
	// A day no job arrived on tells no wait: its columns say "-", not 0 s.
	if err := os.WriteFile(trace, []byte("0,60\n180000,60\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, _, err := runSim(t, "--trace", trace)
	if err != nil {
		t.Fatal(err)
	}
	var tue string
	for l := range strings.Lines(out) {
		if f := strings.Fields(l); len(f) > 2 && f[1] == "Tue" {
			tue = l
		}
	}
	if f := strings.Fields(tue); len(f) < 6 || f[2] != "0" || f[3] != "-" || f[4] != "-" || f[5] != "-" {
		t.Errorf("a day without jobs: %q, want 0 jobs and no waits", tue)
	}
}

// A trace whose first job comes on a Thursday runs from that Thursday: the
// days before it are not billed (the default floors would bill each
// weekday's business hours) nor printed, its days keep their weekdays, and
// --days counts from it.
func TestSimTraceStartsOnItsFirstDay(t *testing.T) {
	trace := filepath.Join(t.TempDir(), "jobs.csv")
	thu := 3 * 86400
	csv := fmt.Sprintf("%d,60\n%d,60\n%d,60\n", thu+10*3600, thu+86400+10*3600, thu+2*86400+10*3600)
	if err := os.WriteFile(trace, []byte(csv), 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (res struct {
		Jobs             int     `json:"jobs"`
		InstanceSeconds  float64 `json:"instance_seconds"`
		SimulatedSeconds float64 `json:"simulated_seconds"`
		Days             []struct {
			Day  int `json:"day"`
			Jobs int `json:"jobs"`
		} `json:"days"`
	}) {
		t.Helper()
		out, _, err := runSim(t, append([]string{"--trace", trace, "--json"}, args...)...)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal([]byte(out), &res); err != nil {
			t.Fatal(err)
		}
		return res
	}
	all := run()
	if all.Jobs != 3 || len(all.Days) != 3 || all.Days[0].Day != 3 || all.Days[0].Jobs != 1 || all.Days[2].Day != 5 {
		t.Fatalf("days %+v of %d jobs: want Thursday (day 3), Friday and Saturday, a job each", all.Days, all.Jobs)
	}
	// Simulated from Thursday 00:00 to after Saturday's job; floors on
	// Thursday and Friday (4 slots, 07:00-18:59) bill at most 12 h each.
	if all.SimulatedSeconds > 3*86400 || all.InstanceSeconds > 2*13*3600 {
		t.Errorf("simulated %.0f s, billed %.0f s: the days before the trace are billed", all.SimulatedSeconds, all.InstanceSeconds)
	}
	if two := run("--days", "2"); two.Jobs != 2 || len(two.Days) != 2 || two.Days[1].Day != 4 {
		t.Errorf("--days 2: %d jobs on days %+v, want Thursday's and Friday's", two.Jobs, two.Days)
	}
	out, _, err := runSim(t, "--trace", trace)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "    4  Thu") || strings.Contains(out, "Mon") {
		t.Errorf("the table does not start on Thursday, day 4:\n%s", out)
	}
	if _, _, err := runSim(t, "--trace", trace, "--explain", "2:10"); err == nil || !strings.Contains(err.Error(), "starts on day 4 (Thursday)") {
		t.Errorf("--explain before the trace's first day: %v", err)
	}
	if _, _, err := runSim(t, "--trace", trace, "--explain", "5:10"); err != nil {
		t.Errorf("--explain on the trace's second day: %v", err)
	}
}

// simJobs runs berth sim --json with args and returns how many jobs it
// simulated, and its stderr.
func simJobs(t *testing.T, args ...string) (int, string) {
	t.Helper()
	out, errOut, err := runSim(t, append(args, "--json")...)
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		Jobs int `json:"jobs"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	return res.Jobs, errOut
}

// --job-share keeps that share of the jobs, the same ones for a seed, and
// says how many.
func TestSimJobShare(t *testing.T) {
	jobs := func(args ...string) (int, string) {
		t.Helper()
		return simJobs(t, append([]string{"--workload", "steady", "--hours", "6"}, args...)...)
	}
	all, _ := jobs()
	tenth, says := jobs("--job-share", "0.1")
	if want := fmt.Sprintf("kept %d of %d jobs", tenth, all); !strings.Contains(says, want) || tenth < all/20 || tenth > all/5 {
		t.Errorf("--job-share 0.1: %d of %d jobs, stderr %q", tenth, all, says)
	}
	if again, _ := jobs("--job-share", "0.1"); again != tenth {
		t.Errorf("--job-share 0.1 kept %d, then %d", tenth, again)
	}
	for _, bad := range []string{"0", "1.5", "-0.2", "NaN"} {
		if _, _, err := runSim(t, "--job-share", bad); err == nil || !strings.Contains(err.Error(), "--job-share") {
			t.Errorf("--job-share %s: %v", bad, err)
		}
	}
}

// --tag-list keeps the jobs of a trace that a runner with those tags would
// take; untagged ones only with --run-untagged, as GitLab registers
// runners; and it says how many it left out.
func TestSimTagList(t *testing.T) {
	trace := filepath.Join(t.TempDir(), "jobs.csv")
	// Tags match exactly (Docker is not docker), as in the coordinator;
	// a job whose tags are blank is untagged.
	csv := "0,60,docker\n10,60,docker,linux\n20,60,gpu\n30,60\n40,60,linux, docker\n50,60,Docker\n60,60, , \n"
	if err := os.WriteFile(trace, []byte(csv), 0o600); err != nil {
		t.Fatal(err)
	}
	jobs := func(args ...string) (int, string) {
		t.Helper()
		return simJobs(t, append([]string{"--trace", trace}, args...)...)
	}
	for _, c := range []struct {
		args []string
		want int
		says string
	}{
		{nil, 7, ""},
		{[]string{"--tag-list", "docker"}, 1, "1 of 7 jobs are for this runner's tags (tags docker; no untagged jobs), 6 left out"},
		{[]string{"--tag-list", "linux,docker"}, 3, "3 of 7 jobs"},
		{[]string{"--tag-list", "linux,docker", "--run-untagged"}, 5, "untagged jobs too"},
		{[]string{"--tag-list", ""}, 2, "(no tags; untagged jobs too)"},
	} {
		n, errOut := jobs(c.args...)
		if n != c.want || !strings.Contains(errOut, c.says) {
			t.Errorf("%v: %d jobs, stderr %q; want %d and %q", c.args, n, errOut, c.want, c.says)
		}
	}
	if _, _, err := runSim(t, "--trace", trace, "--run-untagged=false"); err == nil || !strings.Contains(err.Error(), "no job") {
		t.Errorf("a runner without tags nor untagged jobs: %v", err)
	}
	if _, _, err := runSim(t, "--workload", "steady", "--tag-list", "docker"); err == nil || !strings.Contains(err.Error(), "--trace") {
		t.Errorf("--tag-list with a built-in workload: %v", err)
	}
}

// The scaler's warnings are told once each after the run, with how many
// times they came: boots that outlast idle_time are advice on the
// configuration, shown with or without --explain and not otherwise.
func TestSimTellsScalerWarnings(t *testing.T) {
	const slow = `the scaler warned 1× "boots take longer than idle_time`
	for _, c := range []struct {
		args []string
		want bool
	}{
		{[]string{"--boot", "6m"}, true},
		{[]string{"--boot", "6m", "--explain", "1:01"}, true},
		{nil, false},
	} {
		_, errOut, err := runSim(t, append([]string{"--workload", "steady", "--hours", "3", "--idle-count", "0", "--json"}, c.args...)...)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(errOut, slow) && strings.Contains(errOut, "boot_latency=6m"); got != c.want {
			t.Errorf("%v: stderr %q, want the slow boots told: %t", c.args, errOut, c.want)
		}
	}
}
