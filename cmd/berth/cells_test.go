package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/client"
	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/internal/testenv"
	"github.com/berthci/berth/runnerapi"
	"github.com/berthci/berth/token"
)

// freeAddr is a loopback address nothing listens on (yet).
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func waitHealthy(t *testing.T, what, addr string) {
	t.Helper()
	waitFor(t, 60*time.Second, what+" healthy", func() bool {
		resp, err := http.Get("http://" + addr + "/-/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// cellRunner is a runner of one type created in one cell.
type cellRunner struct {
	cell        int64
	kind, token string
	id          int64
}

// TestCellsEndToEnd: two cells (berth server --cell-id 1 and 2, each its
// own SQLite store), a berth router in front of them without a default
// cell, and one runner manager serving an instance, a group and a project
// runner of each cell through the router with room for fewer jobs than
// it has entries; cell 1's runners long-poll, cell 2's take their jobs
// over the push channel (a WebSocket the router routes by the runner
// token). Everything goes through the router: project creation and git
// pushes (admin tokens), runner creation, long polls and push streams,
// job updates, traces, artifacts and git fetches (job tokens). Every job
// runs in its own cell, on the runner of the type it asks for.
func TestCellsEndToEnd(t *testing.T) {
	testenv.LookPath(t, "git")
	testenv.LookPath(t, "bash")
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	dir := t.TempDir()
	routerAddr := freeAddr(t)
	routerURL := "http://" + routerAddr

	admins := map[int64]string{}
	var cellFlags []string
	for _, cell := range []int64{1, 2} {
		addr, data := freeAddr(t), filepath.Join(dir, fmt.Sprint("cell", cell))
		startBerth(t, "server", "--cell-id", fmt.Sprint(cell), "--data", data, "--listen", addr, "--external-url", routerURL,
			"--long-poll-timeout", "5s", "--log-level", "info")
		waitHealthy(t, "cell "+fmt.Sprint(cell), addr)
		var b []byte
		waitFor(t, 30*time.Second, "cell's admin token file", func() bool {
			var err error
			b, err = os.ReadFile(filepath.Join(data, adminTokenFile))
			return err == nil && len(b) > 0
		})
		admins[cell] = strings.TrimSpace(string(b))
		if r, err := token.ParseRoutable(admins[cell]); err != nil || r.Cell != cell {
			t.Fatalf("cell %d's admin token routes to %+v (%v)", cell, r, err)
		}
		cellFlags = append(cellFlags, "--cell", fmt.Sprintf("%d=http://%s", cell, addr))
	}
	// No default cell: a request whose token names no cell is refused, so
	// everything below reaches its cell by its token alone.
	router := startBerth(t, append([]string{"router", "--listen", routerAddr, "--external-url", routerURL, "--log-level", "debug"}, cellFlags...)...)
	waitHealthy(t, "the router", routerAddr)

	const ci = `build:
  tags: [inst]
  script:
    - echo "built by $CI_RUNNER_DESCRIPTION" > out.txt
  artifacts:
    paths: [out.txt]
test:
  tags: [proj]
  needs: [build]
  script:
    - cat out.txt
    - grep -q "built by $CELL instance" out.txt
`
	var runners []cellRunner
	pipelines := map[int64][2]int64{} // cell → project, pipeline
	groupJobs := map[int64]int64{}
	for _, cell := range []int64{1, 2} {
		c := client.New(routerURL, admins[cell])
		project := fmt.Sprintf("cell%d/app", cell)
		src := filepath.Join(dir, project)
		if err := os.MkdirAll(src, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(src, ".gitlab-ci.yml"), []byte(ci), 0o644); err != nil {
			t.Fatal(err)
		}
		proj, err := c.CreateProject(ctx, restapi.CreateProjectRequest{Path: project})
		if err != nil {
			t.Fatalf("creating project in cell %d through the router: %v", cell, err)
		}
		name := fmt.Sprintf("cell %d", cell)
		for _, r := range []struct {
			kind string
			req  restapi.CreateRunnerRequest
		}{
			{"instance", restapi.CreateRunnerRequest{RunnerType: "instance_type", TagList: []string{"inst"}}},
			{"group", restapi.CreateRunnerRequest{RunnerType: "group_type", GroupID: 100 + cell, TagList: []string{"grp"}}},
			{"project", restapi.CreateRunnerRequest{RunnerType: "project_type", ProjectID: proj.ID, TagList: []string{"proj"}}},
		} {
			r.req.Description = name + " " + r.kind
			created, err := c.CreateRunner(ctx, r.req)
			if err != nil {
				t.Fatalf("creating a %s runner in cell %d: %v", r.kind, cell, err)
			}
			if rt, err := token.ParseRoutable(created.Token); err != nil || rt.Cell != cell {
				t.Fatalf("cell %d's %s runner token routes to %+v (%v)", cell, r.kind, rt, err)
			}
			runners = append(runners, cellRunner{cell: cell, kind: r.kind, token: created.Token, id: created.ID})
		}
		out, err := runCLI(t, "pipelines", "create", "--server", routerURL, "--admin-token", admins[cell], "--project", project,
			"--var", "CELL="+name, src)
		if err != nil {
			t.Fatalf("pipelines create in cell %d: %v", cell, err)
		}
		var pl int64
		fmt.Sscan(out, &pl)
		pipelines[cell] = [2]int64{proj.ID, pl}
		// A group runner's job: enqueued with the group's namespace.
		j, err := c.Enqueue(ctx, dispatch.JobSpec{Name: "group job", ProjectID: proj.ID, NamespaceID: 100 + cell, Tags: []string{"grp"},
			Steps: []runnerapi.Step{{Name: "script", Script: []string{`echo "group job on $CI_RUNNER_DESCRIPTION"`}, When: "on_success", Timeout: 600}}})
		if err != nil {
			t.Fatal(err)
		}
		groupJobs[cell] = j.ID
	}

	var cfg strings.Builder
	fmt.Fprintf(&cfg, "concurrent = 2\ncheck_interval = 1\n")
	for _, r := range runners {
		fmt.Fprintf(&cfg, "\n[[runners]]\n  name = %q\n  url = %q\n  token = %q\n  executor = \"shell\"\n  builds_dir = %q\n  cache_dir = %q\n",
			fmt.Sprintf("cell %d %s", r.cell, r.kind), routerURL, r.token, filepath.Join(dir, "builds"), filepath.Join(dir, "cache"))
		if r.cell == 2 {
			// Cell 2's runners take their jobs over the push channel: a
			// WebSocket the router routes by its Bearer runner token.
			cfg.WriteString("  [runners.feature_flags]\n    FF_USE_JOB_ROUTER = true\n")
		}
	}
	cfgPath := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfgPath, []byte(cfg.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	manager := startBerth(t, "runner", "run", "-c", cfgPath)

	runnerOf := func(cell int64, kind string) int64 {
		for _, r := range runners {
			if r.cell == cell && r.kind == kind {
				return r.id
			}
		}
		return 0
	}
	for _, cell := range []int64{1, 2} {
		c := client.New(routerURL, admins[cell])
		pid, pl := pipelines[cell][0], pipelines[cell][1]
		deadline := time.Now().Add(3 * time.Minute)
		for {
			p, err := c.Pipeline(ctx, pl)
			if err == nil && (p.Status == "success" || p.Status == "failed") {
				j, err := c.Job(ctx, pid, groupJobs[cell])
				if err == nil && (j.Status == "success" || j.Status == "failed") {
					break
				}
			}
			if time.Now().After(deadline) {
				jobs, _ := c.PipelineJobs(ctx, pid, pl)
				t.Fatalf("timed out waiting for cell %d's pipeline and group job: %+v\nmanager:\n%s\nrouter:\n%s", cell, jobs, manager.out.String(), router.out.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
		if p, _ := c.Pipeline(ctx, pl); p.Status != "success" {
			jobs, _ := c.PipelineJobs(ctx, pid, pl)
			t.Fatalf("cell %d's pipeline %s: %+v\nmanager:\n%s\nrouter:\n%s", cell, p.Status, jobs, manager.out.String(), router.out.String())
		}
		jobs, err := c.PipelineJobs(ctx, pid, pl)
		if err != nil {
			t.Fatal(err)
		}
		for _, j := range jobs {
			want := map[string]string{"build": "instance", "test": "project"}[j.Name]
			if j.Runner == nil || j.Runner.ID != runnerOf(cell, want) {
				t.Errorf("cell %d's job %s ran on runner %+v, want cell %d's %s runner %d", cell, j.Name, j.Runner, cell, want, runnerOf(cell, want))
			}
		}
		gj, err := c.Job(ctx, pid, groupJobs[cell])
		if err != nil || gj.Status != "success" || gj.Runner == nil || gj.Runner.ID != runnerOf(cell, "group") {
			t.Errorf("cell %d's group job: %+v %v", cell, gj, err)
		}
		var log strings.Builder
		if err := c.Trace(ctx, pid, groupJobs[cell], &log); err != nil || !strings.Contains(log.String(), fmt.Sprintf("group job on cell %d group", cell)) {
			t.Errorf("cell %d's group job log: %v\n%s", cell, err, log.String())
		}
	}
	// Cell 2's runners held push streams through the router.
	if out := manager.out.String(); strings.Count(out, "job push stream open") < 3 || !strings.Contains(router.out.String(), "path=/api/v4/berth/job-router cell=2 by=bearer") {
		t.Errorf("cell 2's runners did not push through the router:\nmanager:\n%s", out)
	}
	// The router refused nothing and logged no token.
	if out := router.out.String(); strings.Contains(out, "status=421") || strings.Contains(out, "glrt-") || strings.Contains(out, "glcbt-") || strings.Contains(out, "glpat-") {
		t.Errorf("router log:\n%s", out)
	}
}
