package graph

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/store"
)

// nd builds a node from a compact description:
// "name stage=N status=S when=W needs=a,b dag af exit=3 afexit=3,4".
func nd(id int64, desc string) *Node {
	f := strings.Fields(desc)
	n := &Node{ID: id, Name: f[0], Status: store.StatusCreated, Graph: Job{When: "on_success"}}
	for _, kv := range f[1:] {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "stage":
			fmt.Sscan(v, &n.Graph.StageIndex)
		case "status":
			n.Status = store.Status(v)
		case "when":
			n.Graph.When = v
		case "needs":
			n.Graph.DAG = true
			for _, name := range strings.Split(v, ",") {
				if name != "" {
					n.Graph.Needs = append(n.Graph.Needs, Need{Job: name})
				}
			}
		case "dag":
			n.Graph.DAG = true
		case "af":
			n.Graph.AllowFailure = true
		case "exit":
			fmt.Sscan(v, &n.ExitCode)
		case "afexit":
			for _, c := range strings.Split(v, ",") {
				var x int
				fmt.Sscan(c, &x)
				n.Graph.AllowFailureExitCodes = append(n.Graph.AllowFailureExitCodes, x)
			}
		case "start":
			fmt.Sscan(v, &n.Graph.StartInSeconds)
		case "retried":
			n.Retried = true
		case "immediate":
			n.Graph.Immediate = true
		default:
			panic("bad Node attribute " + kv)
		}
	}
	return n
}

func nodes(descs ...string) []*Node {
	var out []*Node
	for i, d := range descs {
		out = append(out, nd(int64(i+1), d))
	}
	return out
}

func TestCompositeStatus(t *testing.T) {
	tests := []struct {
		jobs     []string
		want     store.Status
		warnings bool
	}{
		{nil, "", false},
		{[]string{"a status=success", "b status=success"}, store.StatusSuccess, false},
		{[]string{"a status=success", "b status=skipped"}, store.StatusSuccess, false},
		{[]string{"a status=skipped"}, store.StatusSkipped, false},
		{[]string{"a status=created", "b status=created"}, store.StatusCreated, false},
		{[]string{"a status=success", "b status=failed"}, store.StatusFailed, false},
		{[]string{"a status=success", "b status=failed af"}, store.StatusSuccess, true},
		{[]string{"a status=failed af"}, store.StatusSuccess, true},
		{[]string{"a status=failed exit=3 afexit=3,4"}, store.StatusSuccess, true},
		{[]string{"a status=failed exit=5 afexit=3,4"}, store.StatusFailed, false},
		{[]string{"a status=canceled af", "b status=success"}, store.StatusSuccess, true},
		{[]string{"a status=success", "b status=canceled"}, store.StatusCanceled, false},
		{[]string{"a status=failed", "b status=canceled"}, store.StatusFailed, false},
		{[]string{"a status=pending", "b status=created"}, store.StatusPending, false},
		{[]string{"a status=pending", "b status=success"}, store.StatusRunning, false},
		{[]string{"a status=running", "b status=failed"}, store.StatusRunning, false},
		{[]string{"a status=canceling", "b status=running"}, store.StatusCanceling, false},
		{[]string{"a status=success", "b status=manual"}, store.StatusManual, false},
		{[]string{"a status=success", "b status=manual af"}, store.StatusSuccess, false},
		{[]string{"a status=manual af"}, store.StatusSkipped, false},
		{[]string{"a status=success", "b status=scheduled"}, store.StatusScheduled, false},
		{[]string{"a status=waiting_for_resource", "b status=manual"}, store.StatusWaitingForResource, false},
		{[]string{"a status=success", "b status=created"}, store.StatusRunning, false},
		{[]string{"a status=failed", "b status=created"}, store.StatusRunning, false},
		{[]string{"a status=failed", "b status=skipped"}, store.StatusFailed, false},
	}
	for _, tt := range tests {
		got, warn := CompositeStatus(nodes(tt.jobs...))
		if got != tt.want || warn != tt.warnings {
			t.Errorf("compositeStatus(%q) = %q, warnings %v; want %q, %v", tt.jobs, got, warn, tt.want, tt.warnings)
		}
	}
}

func TestPlan(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		name string
		jobs []string
		want map[string]ActionKind // name → action; absent: nothing happens
	}{
		{"first stage runs, later stages wait",
			[]string{"a stage=0", "b stage=0", "c stage=1"},
			map[string]ActionKind{"a": ActEnqueue, "b": ActEnqueue}},
		{"stage waits for every earlier job",
			[]string{"a stage=0 status=success", "b stage=0 status=running", "c stage=1"},
			nil},
		{"next stage after success",
			[]string{"a stage=0 status=success", "b stage=0 status=success", "c stage=1", "d stage=2"},
			map[string]ActionKind{"c": ActEnqueue}},
		{"failure skips on_success, runs on_failure and always",
			[]string{"a stage=0 status=failed", "b stage=1", "c stage=1 when=on_failure", "d stage=1 when=always", "e stage=1 when=manual"},
			map[string]ActionKind{"b": ActSkip, "c": ActEnqueue, "d": ActEnqueue, "e": ActSkip}},
		{"on_failure skipped after success",
			[]string{"a stage=0 status=success", "c stage=1 when=on_failure"},
			map[string]ActionKind{"c": ActSkip}},
		{"allowed failure counts as success",
			[]string{"a stage=0 status=failed af", "b stage=1", "c stage=1 when=on_failure"},
			map[string]ActionKind{"b": ActEnqueue, "c": ActSkip}},
		{"allowed exit code counts as success",
			[]string{"a stage=0 status=failed exit=42 afexit=42", "b stage=1"},
			map[string]ActionKind{"b": ActEnqueue}},
		{"other exit code fails",
			[]string{"a stage=0 status=failed exit=1 afexit=42", "b stage=1"},
			map[string]ActionKind{"b": ActSkip}},
		{"skips cascade through stages in one plan",
			[]string{"a stage=0 status=failed", "b stage=1", "c stage=2", "d stage=3 when=on_failure"},
			map[string]ActionKind{"b": ActSkip, "c": ActSkip, "d": ActEnqueue}},
		{"a skipped stage lets on_success run (stage scheduling)",
			[]string{"a stage=0 status=skipped", "b stage=1"},
			map[string]ActionKind{"b": ActEnqueue}},
		{"manual and delayed",
			[]string{"a stage=0 status=success", "m stage=1 when=manual af", "d stage=1 when=delayed start=300"},
			map[string]ActionKind{"m": ActManual, "d": ActSchedule}},
		{"manual allowed to fail does not block the next stage",
			[]string{"m stage=0 status=manual af", "b stage=1"},
			map[string]ActionKind{"b": ActEnqueue}},
		{"blocking manual job blocks the next stage",
			[]string{"m stage=0 status=manual", "b stage=1"},
			nil},
		{"retried manual job runs at once",
			[]string{"m stage=0 when=manual immediate"},
			map[string]ActionKind{"m": ActEnqueue}},
		{"needs: DAG job runs before its stage",
			[]string{"a stage=0 status=success", "slow stage=0 status=running", "b stage=1 needs=a", "c stage=1"},
			map[string]ActionKind{"b": ActEnqueue}},
		{"needs: [] runs at once",
			[]string{"a stage=0 status=running", "b stage=2 dag"},
			map[string]ActionKind{"b": ActEnqueue}},
		{"DAG job is skipped when a need was skipped",
			[]string{"a stage=0 status=skipped", "b stage=1 needs=a"},
			map[string]ActionKind{"b": ActSkip}},
		{"DAG job is skipped when a need failed",
			[]string{"a stage=0 status=failed", "b stage=1 needs=a", "c stage=1 needs=a when=on_failure"},
			map[string]ActionKind{"b": ActSkip, "c": ActEnqueue}},
		{"DAG chain in one stage",
			[]string{"a stage=0 status=success", "b stage=0 needs=a", "c stage=0 needs=b"},
			map[string]ActionKind{"b": ActEnqueue}},
		{"DAG skip cascades along needs",
			[]string{"a stage=0 status=failed", "b stage=1 needs=a", "c stage=2 needs=b", "d stage=3"},
			map[string]ActionKind{"b": ActSkip, "c": ActSkip, "d": ActSkip}},
		{"retried jobs are ignored, their replacement counts",
			[]string{"a stage=0 status=failed retried", "a stage=0 status=running", "b stage=1"},
			nil},
		{"replacement succeeded",
			[]string{"a stage=0 status=failed retried", "a stage=0 status=success", "b stage=1"},
			map[string]ActionKind{"b": ActEnqueue}},
		{"canceled predecessor skips everything",
			[]string{"a stage=0 status=canceled", "b stage=1", "c stage=1 when=always"},
			map[string]ActionKind{"b": ActSkip, "c": ActSkip}},
		{"finished and waiting jobs are left alone",
			[]string{"a stage=0 status=success", "b stage=0 status=manual", "c stage=0 status=waiting_for_resource"},
			nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			jobs := nodes(tt.jobs...)
			acts := Plan(jobs, now)
			got := map[string]ActionKind{}
			for _, a := range acts {
				for _, n := range jobs {
					if n.ID == a.ID {
						got[n.Name] = a.Kind
						if a.Kind == ActSchedule {
							if want := now.Add(time.Duration(n.Graph.StartInSeconds) * time.Second); !a.At.Equal(want) {
								t.Errorf("%s scheduled at %v, want %v", n.Name, a.At, want)
							}
						}
					}
				}
			}
			want := tt.want
			if want == nil {
				want = map[string]ActionKind{}
			}
			if !maps.Equal(got, want) {
				t.Errorf("plan = %v, want %v", got, want)
			}
			// Plan is pure: the input is untouched.
			for i, n := range nodes(tt.jobs...) {
				if jobs[i].Status != n.Status {
					t.Errorf("plan changed its input: %s is %s", n.Name, jobs[i].Status)
				}
			}
		})
	}
}

func TestPlanScheduledDue(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	jobs := nodes("a status=scheduled", "b status=scheduled", "c stage=1")
	jobs[0].ScheduledAt = now
	jobs[1].ScheduledAt = now.Add(time.Second)
	acts := Plan(jobs, now)
	if len(acts) != 1 || acts[0].ID != jobs[0].ID || acts[0].Kind != ActEnqueue {
		t.Errorf("plan = %+v, want only a enqueued (due); b not yet, c waits", acts)
	}
}

func TestAutoRetry(t *testing.T) {
	tests := []struct {
		name    string
		graph   Job
		reason  string
		exit    int
		retries int
		want    bool
	}{
		{"no retry configured", Job{}, "script_failure", 1, 0, false},
		{"max 2, first failure", Job{RetryMax: 2}, "script_failure", 1, 0, true},
		{"max 2, second failure", Job{RetryMax: 2}, "script_failure", 1, 1, true},
		{"max 2, exhausted", Job{RetryMax: 2}, "script_failure", 1, 2, false},
		{"when matches", Job{RetryMax: 1, RetryWhen: []string{"runner_system_failure"}}, "runner_system_failure", 0, 0, true},
		{"when does not match", Job{RetryMax: 1, RetryWhen: []string{"runner_system_failure"}}, "script_failure", 1, 0, false},
		{"when always", Job{RetryMax: 1, RetryWhen: []string{"always"}}, "job_execution_timeout", 0, 0, true},
		{"exit code matches", Job{RetryMax: 1, RetryExitCodes: []int{137}}, "script_failure", 137, 0, true},
		{"exit codes alone drop the always default", Job{RetryMax: 1, RetryExitCodes: []int{137}}, "script_failure", 1, 0, false},
		{"exit code or reason", Job{RetryMax: 1, RetryWhen: []string{"stuck_or_timeout_failure"}, RetryExitCodes: []int{2}}, "stuck_or_timeout_failure", 0, 0, true},
		{"never for missing dependencies", Job{RetryMax: 2}, "missing_dependency_failure", 0, 0, false},
		{"scheduler failures twice by default", Job{}, "scheduler_failure", 0, 1, true},
		{"runner_interrupted by its own name", Job{RetryMax: 1, RetryWhen: []string{"runner_interrupted"}}, "runner_interrupted", 0, 0, true},
		{"runner_interrupted is not a runner_system_failure", Job{RetryMax: 1, RetryWhen: []string{"runner_system_failure"}}, "runner_interrupted", 0, 0, false},
		{"stuck_or_timeout_failure covers its 19.1 parts", Job{RetryMax: 1, RetryWhen: []string{"stuck_or_timeout_failure"}}, "no_updates_running", 0, 0, true},
		{"job_execution_timeout covers its 19.1 parts", Job{RetryMax: 1, RetryWhen: []string{"job_execution_timeout"}}, "server_timeout_running", 0, 0, true},
	}
	for _, tt := range tests {
		n := &Node{Name: "j", Status: store.StatusFailed, FailureReason: tt.reason, ExitCode: tt.exit, Graph: tt.graph}
		if got := AutoRetry(n, tt.retries); got != tt.want {
			t.Errorf("%s: AutoRetry = %v, want %v", tt.name, got, tt.want)
		}
	}
	n := &Node{Name: "j", Status: store.StatusCanceled, Graph: Job{RetryMax: 2}}
	if AutoRetry(n, 0) {
		t.Error("a canceled job must not be retried automatically")
	}
}

func TestDownstream(t *testing.T) {
	jobs := nodes(
		"build stage=0 status=failed",
		"lint stage=0 status=success",
		"unit stage=1 needs=build status=skipped",
		"e2e stage=1 needs=unit status=skipped",
		"docs stage=1 needs=lint status=success",
		"deploy stage=2 status=skipped",
	)
	var got []string
	for _, n := range Downstream(jobs, jobs[0]) {
		got = append(got, n.Name)
	}
	want := []string{"unit", "e2e", "deploy"}
	if !slices.Equal(got, want) {
		t.Errorf("downstream(build) = %v, want %v", got, want)
	}
	got = nil
	for _, n := range Downstream(jobs, jobs[4]) {
		got = append(got, n.Name)
	}
	if !slices.Equal(got, []string{"deploy"}) {
		t.Errorf("downstream(docs) = %v, want [deploy]", got)
	}
}
