package docker

import (
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/api/types/volume"
	"github.com/docker/docker/client"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/executor/executortest"
	"github.com/berthci/berth/internal/testenv"
	"github.com/berthci/berth/runner/config"
	"github.com/berthci/berth/runnerapi"
)

// Images built by .ci/images.
const (
	busybox = "berth-test/busybox:latest"
	httpd   = "berth-test/httpd:latest"
	debian  = "berth-test/debian:bookworm"
)

var (
	stateOnce sync.Once
	stateDir  string
)

// testStateDir is one helper-bundle directory for the whole test binary,
// removed by TestMain.
func testStateDir(t testing.TB) string {
	stateOnce.Do(func() {
		d, err := os.MkdirTemp("", "berth-docker-test-")
		if err != nil {
			panic(err)
		}
		stateDir = d
	})
	return stateDir
}

func TestMain(m *testing.M) {
	code := m.Run()
	if stateDir != "" {
		os.RemoveAll(stateDir)
	}
	os.Exit(code)
}

// dockerClient returns a client of the local engine, or skips the test.
func dockerClient(t testing.TB, images ...string) *client.Client {
	t.Helper()
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		testenv.Missing(t, "docker client: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := cli.Ping(ctx); err != nil {
		cli.Close()
		testenv.Missing(t, "Docker Engine not reachable: %v", err)
	}
	t.Cleanup(func() { cli.Close() })
	for _, img := range images {
		if _, err := cli.ImageInspect(ctx, img); err != nil {
			testenv.Missing(t, "image %s missing (build it with .ci/images): %v", img, err)
		}
	}
	return cli
}

// newProvider returns a provider for cfg (pull policy if-not-present
// unless set) and removes the persistent volumes of short when the test
// ends.
func newProvider(t testing.TB, cli *client.Client, cfg config.Docker, short string, mod ...func(*Options)) *Provider {
	t.Helper()
	if len(cfg.PullPolicy) == 0 {
		cfg.PullPolicy = config.StringList{config.PullIfNotPresent}
	}
	o := Options{Config: cfg, StateDir: testStateDir(t), KillGrace: 2 * time.Second}
	for _, m := range mod {
		m(&o)
	}
	p, err := New(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		removeVolumes(t, cli, short)
		_ = p.Shutdown(context.Background())
	})
	return p
}

// removeVolumes removes the persistent volumes of a runner.
func removeVolumes(t testing.TB, cli *client.Client, short string) {
	ctx := context.Background()
	vs, err := cli.VolumeList(ctx, volume.ListOptions{Filters: filters.NewArgs(filters.Arg("label", LabelShortToken+"="+short))})
	if err != nil {
		t.Errorf("listing volumes: %v", err)
		return
	}
	for _, v := range vs.Volumes {
		_ = cli.VolumeRemove(ctx, v.Name, true)
	}
}

// leftovers lists the containers and networks labelled with short.
func leftovers(t testing.TB, cli *client.Client, short string) []string {
	t.Helper()
	ctx := context.Background()
	f := filters.NewArgs(filters.Arg("label", LabelShortToken+"="+short))
	var out []string
	cs, err := cli.ContainerList(ctx, container.ListOptions{All: true, Filters: f})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cs {
		out = append(out, "container "+strings.Join(c.Names, ","))
	}
	ns, err := cli.NetworkList(ctx, network.ListOptions{Filters: f})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range ns {
		out = append(out, "network "+n.Name)
	}
	return out
}

// execIn runs cmd in a container as root and returns its output and
// exit code.
func execIn(ctx context.Context, cli *client.Client, id string, cmd ...string) (string, int, error) {
	cr, err := cli.ContainerExecCreate(ctx, id, container.ExecOptions{Cmd: cmd, User: "0", AttachStdout: true, AttachStderr: true})
	if err != nil {
		return "", -1, err
	}
	hj, err := cli.ContainerExecAttach(ctx, cr.ID, container.ExecAttachOptions{})
	if err != nil {
		return "", -1, err
	}
	defer hj.Close()
	var buf bytes.Buffer
	if _, err := stdcopy.StdCopy(&buf, &buf, hj.Reader); err != nil {
		return "", -1, err
	}
	for {
		ins, err := cli.ContainerExecInspect(ctx, cr.ID)
		if err != nil {
			return "", -1, err
		}
		if !ins.Running {
			return buf.String(), ins.ExitCode, nil
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// buildContainers are the running build containers of a runner.
func buildContainers(cli *client.Client, short string) []string {
	cs, err := cli.ContainerList(context.Background(), container.ListOptions{Filters: filters.NewArgs(
		filters.Arg("label", LabelShortToken+"="+short), filters.Arg("label", LabelType+"="+typeBuild))})
	if err != nil {
		return nil
	}
	var ids []string
	for _, c := range cs {
		ids = append(ids, c.ID)
	}
	return ids
}

// inBuild runs a POSIX sh snippet in every build container of short and
// reports whether it succeeded in any.
func inBuild(cli *client.Client, short, script string, args ...string) bool {
	ok := false
	for _, id := range buildContainers(cli, short) {
		_, code, err := execIn(context.Background(), cli, id, append([]string{"sh", "-c", script, "sh"}, args...)...)
		if err == nil && code == 0 {
			ok = true
		}
	}
	return ok
}

// aliveScript succeeds when process $1 exists and is not a zombie.
const aliveScript = `st=$(cat /proc/$1/stat 2>/dev/null) || exit 1
case "$st" in *") Z "*) exit 1 ;; esac`

func TestConformance(t *testing.T) {
	cli := dockerClient(t, busybox)
	const short = "abcdefghi" // the suite's
	executortest.Run(t, executortest.Config{
		NewProvider: func(t *testing.T, dir string) executor.Provider {
			return newProvider(t, cli, config.Docker{}, short)
		},
		Disposable:   true,
		ProcessAlive: func(pid int) bool { return inBuild(cli, short, aliveScript, strconv.Itoa(pid)) },
		FileExists:   func(p string) bool { return inBuild(cli, short, `test -e "$1"`, p) },
		CreateFile: func(p string) error {
			if !inBuild(cli, short, `: > "$1"`, p) {
				return fmt.Errorf("creating %s in the build container failed", p)
			}
			return nil
		},
		Job: func() *runnerapi.JobResponse {
			return &runnerapi.JobResponse{Image: &runnerapi.Image{Name: busybox}}
		},
	})
	if l := leftovers(t, cli, short); len(l) > 0 {
		t.Errorf("left behind: %v", l)
	}
}

// testJob runs one job: Prepare with opts, the scripts, Cleanup.
type testJob struct {
	t    *testing.T
	e    executor.Executor
	env  executor.Environment
	prep bytes.Buffer
}

func prepare(t *testing.T, p *Provider, o executor.PrepareOptions) (*testJob, error) {
	t.Helper()
	ctx := context.Background()
	e, err := p.Create(ctx)
	if err != nil {
		t.Fatal(err)
	}
	j := &testJob{t: t, e: e}
	t.Cleanup(func() {
		if err := e.Cleanup(context.Background()); err != nil {
			t.Errorf("Cleanup: %v", err)
		}
	})
	if o.Output == nil {
		o.Output = &j.prep
	}
	j.env, err = e.Prepare(ctx, o)
	return j, err
}

func mustPrepare(t *testing.T, p *Provider, o executor.PrepareOptions) *testJob {
	t.Helper()
	j, err := prepare(t, p, o)
	if err != nil {
		t.Fatalf("Prepare: %v\n%s", err, j.prep.String())
	}
	return j
}

func (j *testJob) run(script string) (string, error) {
	var buf bytes.Buffer
	err := j.e.Run(context.Background(), executor.Command{Stage: "step_script", Script: script, Output: &buf})
	return buf.String(), err
}

func (j *testJob) mustRun(script string) string {
	j.t.Helper()
	out, err := j.run(script)
	if err != nil {
		j.t.Fatalf("Run: %v\n%s", err, out)
	}
	return out
}

func opts(short string, jobID int64, job *runnerapi.JobResponse) executor.PrepareOptions {
	if job != nil {
		job.ID = jobID
		if job.JobInfo.ProjectID == 0 {
			job.JobInfo.ProjectID = 42
		}
	}
	return executor.PrepareOptions{JobID: jobID, ProjectPath: "group/project", ShortToken: short, SystemID: "s_dockertest", Job: job}
}

func TestServicesByAlias(t *testing.T) {
	t.Parallel()
	cli := dockerClient(t, busybox, httpd)
	const short = "svcalias1"
	p := newProvider(t, cli, config.Docker{}, short)
	j := mustPrepare(t, p, opts(short, 1, &runnerapi.JobResponse{
		Image:    &runnerapi.Image{Name: busybox},
		Services: []runnerapi.Image{{Name: httpd, Alias: "web, www"}},
	}))
	if !strings.Contains(j.prep.String(), "Waiting for services") {
		t.Errorf("no health check in the log:\n%s", j.prep.String())
	}
	out := j.mustRun(`for h in web www berth-test__httpd berth-test-httpd; do printf '%s: ' $h; wget -q -O - http://$h:8080/; done; hostname`)
	if n := strings.Count(out, "hello from the httpd service"); n != 4 {
		t.Fatalf("service reached by %d of 4 aliases:\n%s", n, out)
	}
	if !strings.Contains(out, j.env.Hostname) {
		t.Errorf("hostname %q not the container's: %s", j.env.Hostname, out)
	}
	// The build container is "build" on the job's network.
	j.mustRun(`nslookup build >/dev/null 2>&1 || ping -c1 -W1 build >/dev/null`)
}

func TestServiceVariablesAndCommand(t *testing.T) {
	t.Parallel()
	cli := dockerClient(t, busybox, httpd)
	const short = "svcvars01"
	p := newProvider(t, cli, config.Docker{Services: []config.DockerService{{
		Name: busybox, Alias: "cfgsvc", Entrypoint: []string{"sh", "-c"},
		Command:   []string{`echo "cfg:$CFG_VAR:$JOB_VAR" > /tmp/index.html && exec httpd -f -p 8081 -h /tmp`},
		Variables: []string{"CFG_VAR=from-config", "HEALTHCHECK_TCP_PORT=8081"},
	}}}, short)
	j := mustPrepare(t, p, opts(short, 2, &runnerapi.JobResponse{
		Image:     &runnerapi.Image{Name: busybox},
		Variables: []runnerapi.Variable{{Key: "JOB_VAR", Value: "from-job"}, {Key: "SECRET_FILE", Value: "x", File: true}},
		Services: []runnerapi.Image{{
			Name: httpd, Alias: "svc", Entrypoint: []string{"sh", "-c"},
			Command:   []string{`echo "job:$SVC_VAR:$JOB_VAR:${SECRET_FILE-unset}" > /www/index.html && exec httpd -f -p 8080 -h /www`},
			Variables: []runnerapi.Variable{{Key: "SVC_VAR", Value: "own-$JOB_VAR"}},
		}},
	}))
	out := j.mustRun(`wget -q -O - http://svc:8080/; wget -q -O - http://cfgsvc:8081/`)
	if !strings.Contains(out, "job:own-from-job:from-job:unset") || !strings.Contains(out, "cfg:from-config:from-job") {
		t.Fatalf("service environment:\n%s\nprepare:\n%s", out, j.prep.String())
	}
}

func TestServiceNeverUp(t *testing.T) {
	t.Parallel()
	cli := dockerClient(t, busybox, httpd)
	const short = "svcdown01"
	p := newProvider(t, cli, config.Docker{WaitForServicesTimeout: 2}, short)
	start := time.Now()
	j := mustPrepare(t, p, opts(short, 3, &runnerapi.JobResponse{
		Image:    &runnerapi.Image{Name: busybox},
		Services: []runnerapi.Image{{Name: httpd, Alias: "slow", Command: []string{"sh", "-c", "echo service-log-line; echo to-stderr >&2; exec sleep 1000"}}},
	}))
	log := j.prep.String()
	for _, want := range []string{"probably didn't start properly", "service-log-line", "to-stderr", "8080", "Health check error"} {
		if !strings.Contains(log, want) {
			t.Errorf("warning lacks %q:\n%s", want, log)
		}
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("Prepare took %s with a 2 s services timeout", d)
	}
	if out := j.mustRun("echo job-goes-on"); !strings.Contains(out, "job-goes-on") {
		t.Fatal(out)
	}
}

func TestPullPolicies(t *testing.T) {
	t.Parallel()
	cli := dockerClient(t, busybox)
	const short = "pullpol01"
	missing := "berth-test/does-not-exist:latest"
	for _, tc := range []struct {
		name       string
		cfg        config.Docker
		image      runnerapi.Image
		pull       bool // ErrImagePull
		notAllowed bool // ErrNotAllowed
		text       string
	}{
		{name: "never missing", cfg: config.Docker{PullPolicy: config.StringList{"never"}}, image: runnerapi.Image{Name: missing}, pull: true, text: "not present locally"},
		{name: "if-not-present missing", image: runnerapi.Image{Name: missing}, pull: true, text: "pull policy \"if-not-present\""},
		{name: "always present", cfg: config.Docker{PullPolicy: config.StringList{"always"}}, image: runnerapi.Image{Name: busybox}, pull: true, text: "pull policy \"always\""},
		{name: "always then if-not-present", cfg: config.Docker{PullPolicy: config.StringList{"always", "if-not-present"}}, image: runnerapi.Image{Name: busybox}},
		{name: "never present", cfg: config.Docker{PullPolicy: config.StringList{"never"}}, image: runnerapi.Image{Name: busybox}},
		{name: "job policy not allowed", cfg: config.Docker{PullPolicy: config.StringList{"if-not-present"}}, image: runnerapi.Image{Name: busybox, PullPolicy: []string{"always"}}, notAllowed: true, text: "allowed_pull_policies"},
		{name: "job policy intersected", cfg: config.Docker{AllowedPullPolicies: []string{"never", "if-not-present"}}, image: runnerapi.Image{Name: busybox, PullPolicy: []string{"always", "never"}}},
		{name: "service missing", image: runnerapi.Image{Name: busybox}, pull: true, text: missing},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newProvider(t, cli, tc.cfg, short)
			job := &runnerapi.JobResponse{Image: &tc.image}
			if tc.name == "service missing" {
				job.Services = []runnerapi.Image{{Name: missing}}
			}
			j, err := prepare(t, p, opts(short, 4, job))
			switch {
			case tc.pull:
				if !errors.Is(err, ErrImagePull) || !strings.Contains(err.Error(), tc.text) {
					t.Fatalf("Prepare: %v, want ErrImagePull mentioning %q", err, tc.text)
				}
			case tc.notAllowed:
				if !errors.Is(err, ErrNotAllowed) || !strings.Contains(err.Error(), tc.text) {
					t.Fatalf("Prepare: %v, want ErrNotAllowed mentioning %q", err, tc.text)
				}
			default:
				if err != nil {
					t.Fatalf("Prepare: %v\n%s", err, j.prep.String())
				}
				j.mustRun("true")
			}
		})
	}
	if l := leftovers(t, cli, short); len(l) > 0 {
		t.Errorf("left behind: %v", l)
	}
}

func TestAllowedImagesAndServices(t *testing.T) {
	t.Parallel()
	cli := dockerClient(t, busybox, httpd)
	const short = "allowed01"
	p := newProvider(t, cli, config.Docker{Image: busybox, AllowedImages: []string{"alpine:*", "ruby:*"}, AllowedServices: []string{"postgres:*"}}, short)
	_, err := prepare(t, p, opts(short, 5, &runnerapi.JobResponse{Image: &runnerapi.Image{Name: "berth-test/debian:bookworm"}}))
	if !errors.Is(err, ErrNotAllowed) || !strings.Contains(err.Error(), "alpine:*") {
		t.Fatalf("image outside allowed_images: %v", err)
	}
	// The runner's default image is always allowed.
	j := mustPrepare(t, p, opts(short, 6, &runnerapi.JobResponse{}))
	j.mustRun("true")
	_, err = prepare(t, p, opts(short, 7, &runnerapi.JobResponse{Services: []runnerapi.Image{{Name: httpd}}}))
	if !errors.Is(err, ErrNotAllowed) || !strings.Contains(err.Error(), "postgres:*") {
		t.Fatalf("service outside allowed_services: %v", err)
	}
	limit := 0
	p2 := newProvider(t, cli, config.Docker{Image: busybox, ServicesLimit: &limit}, short)
	_, err = prepare(t, p2, opts(short, 8, &runnerapi.JobResponse{Services: []runnerapi.Image{{Name: httpd}}}))
	if !errors.Is(err, ErrNotAllowed) || !strings.Contains(err.Error(), "services_limit") {
		t.Fatalf("services over services_limit: %v", err)
	}
	_, err = prepare(t, p2, opts(short, 9, &runnerapi.JobResponse{Image: &runnerapi.Image{Name: "Not A Name"}}))
	if err == nil || !strings.Contains(err.Error(), "image") {
		t.Fatalf("malformed image name: %v", err)
	}
}

func TestCancelLeavesNothing(t *testing.T) {
	t.Parallel()
	cli := dockerClient(t, busybox, httpd)
	const short = "cancel001"
	p := newProvider(t, cli, config.Docker{}, short)
	ctx := context.Background()
	e, _ := p.Create(ctx)
	o := opts(short, 10, &runnerapi.JobResponse{Image: &runnerapi.Image{Name: busybox}, Services: []runnerapi.Image{{Name: httpd}}})
	if _, err := e.Prepare(ctx, o); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	var out testenv.SyncBuffer
	go func() {
		done <- e.Run(rctx, executor.Command{Stage: "step_script", Script: "echo started; sleep 1000", Output: &out})
	}()
	for !strings.Contains(out.String(), "started") {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v", err)
	}
	if len(leftovers(t, cli, short)) == 0 {
		t.Fatal("no containers while the job runs: the check below proves nothing")
	}
	if err := e.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	if l := leftovers(t, cli, short); len(l) > 0 {
		t.Fatalf("left behind after a canceled job: %v", l)
	}

	// Canceled while waiting for a service that never comes up: what
	// Prepare had created goes too.
	p2 := newProvider(t, cli, config.Docker{WaitForServicesTimeout: 60}, short)
	e, _ = p2.Create(ctx)
	pctx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer cancel()
	o = opts(short, 11, &runnerapi.JobResponse{Image: &runnerapi.Image{Name: busybox}, Services: []runnerapi.Image{{Name: httpd, Command: []string{"sleep", "1000"}}}})
	if _, err := e.Prepare(pctx, o); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Prepare: %v, want the deadline", err)
	}
	if err := e.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	if l := leftovers(t, cli, short); len(l) > 0 {
		t.Fatalf("left behind after a canceled Prepare: %v", l)
	}
}

func TestSweep(t *testing.T) {
	t.Parallel()
	cli := dockerClient(t, busybox, httpd)
	const short = "sweep0001"
	ctx := context.Background()
	crashed := newProvider(t, cli, config.Docker{}, short)
	e, _ := crashed.Create(ctx)
	o := opts(short, 12, &runnerapi.JobResponse{Image: &runnerapi.Image{Name: busybox}, Services: []runnerapi.Image{{Name: httpd}}})
	if _, err := e.Prepare(ctx, o); err != nil {
		t.Fatal(err)
	}
	// The "crashed" manager never cleans up. Another runner's job and
	// another manager's (same token, other system id) are not touched.
	other := newProvider(t, cli, config.Docker{}, short)
	oo := o
	oo.SystemID = "s_other"
	oo.Job = &runnerapi.JobResponse{Image: &runnerapi.Image{Name: busybox}}
	j := mustPrepare(t, other, oo)
	before := leftovers(t, cli, short)
	if len(before) < 4 {
		t.Fatalf("expected build, service, two networks: %v", before)
	}
	next := newProvider(t, cli, config.Docker{}, short)
	if err := next.Sweep(ctx, executor.SweepOptions{SystemID: "s_dockertest", ShortToken: short}); err != nil {
		t.Fatal(err)
	}
	after := leftovers(t, cli, short)
	if len(after) != 2 {
		t.Fatalf("after Sweep: %v; want only the other manager's container and network", after)
	}
	j.mustRun("true")
	vs, err := cli.VolumeList(ctx, volume.ListOptions{Filters: filters.NewArgs(filters.Arg("label", LabelSystemID+"=s_dockertest"), filters.Arg("label", LabelShortToken+"="+short), filters.Arg("label", LabelType+"="+typeBuilds))})
	if err != nil || len(vs.Volumes) == 0 {
		t.Fatalf("Sweep removed the builds volume: %v %v", vs.Volumes, err)
	}
	if err := e.Cleanup(ctx); err != nil {
		t.Fatalf("Cleanup after Sweep: %v", err)
	}
	// A runner that goes away for good removes its volumes too.
	if err := next.RemoveVolumes(ctx, executor.SweepOptions{SystemID: "s_dockertest", ShortToken: short}); err != nil {
		t.Fatal(err)
	}
	vs, err = cli.VolumeList(ctx, volume.ListOptions{Filters: filters.NewArgs(filters.Arg("label", LabelShortToken+"="+short))})
	if err != nil || len(vs.Volumes) == 0 {
		t.Fatalf("RemoveVolumes removed the other manager's volumes too: %v %v", vs.Volumes, err)
	}
	for _, v := range vs.Volumes {
		if v.Labels[LabelSystemID] != "s_other" {
			t.Errorf("volume %s survives RemoveVolumes", v.Name)
		}
	}
}

func TestBuildVolumeReuse(t *testing.T) {
	t.Parallel()
	cli := dockerClient(t, busybox)
	const short = "reuse0001"
	p := newProvider(t, cli, config.Docker{}, short)
	job := func() *runnerapi.JobResponse { return &runnerapi.JobResponse{Image: &runnerapi.Image{Name: busybox}} }
	j1 := mustPrepare(t, p, opts(short, 13, job()))
	j1.mustRun(fmt.Sprintf(`echo from-job-13 > checkout.txt; echo secret > %q/secret; echo cached > /cache/c.txt`, j1.env.TmpDir))
	if err := j1.e.Cleanup(context.Background()); err != nil {
		t.Fatal(err)
	}
	j2 := mustPrepare(t, p, opts(short, 14, job()))
	if j2.env.BuildDir != j1.env.BuildDir {
		t.Fatalf("build dirs %s and %s", j1.env.BuildDir, j2.env.BuildDir)
	}
	out := j2.mustRun(fmt.Sprintf(`cat checkout.txt; ls -A %q; cat /cache/c.txt`, j2.env.TmpDir))
	if !strings.Contains(out, "from-job-13") || !strings.Contains(out, "cached") || strings.Contains(out, "secret") {
		t.Fatalf("second job of the slot saw %q; want the checkout and the cache, an empty TmpDir", out)
	}
	o3 := opts(short, 15, job())
	o3.ConcurrencyID = 1
	j3 := mustPrepare(t, p, o3)
	if out := j3.mustRun(`cat checkout.txt 2>/dev/null || echo no-checkout; cat /cache/c.txt`); !strings.Contains(out, "no-checkout") || !strings.Contains(out, "cached") {
		t.Fatalf("another slot saw %q; want its own build dir and the project's cache", out)
	}
}

func TestVolumesConfig(t *testing.T) {
	t.Parallel()
	cli := dockerClient(t, busybox)
	const short = "volumes01"
	ro := t.TempDir()
	if err := os.WriteFile(filepath.Join(ro, "in.txt"), []byte("from-host"), 0o644); err != nil {
		t.Fatal(err)
	}
	hostCache := t.TempDir()
	job := func() *runnerapi.JobResponse { return &runnerapi.JobResponse{Image: &runnerapi.Image{Name: busybox}} }
	p := newProvider(t, cli, config.Docker{CacheDir: hostCache, Volumes: []string{ro + ":/data:ro", "/extra"}, Tmpfs: map[string]string{"/scratch": "rw,size=1m"}}, short)
	j := mustPrepare(t, p, opts(short, 30, job()))
	out := j.mustRun(`cat /data/in.txt; touch /data/x 2>/dev/null || echo read-only; echo c > /cache/c.txt; echo e > /extra/e.txt; mount | grep -c ' /scratch type tmpfs'`)
	if !strings.Contains(out, "from-host") || !strings.Contains(out, "read-only") || !strings.HasSuffix(strings.TrimSpace(out), "1") {
		t.Fatalf("binds and tmpfs: %s", out)
	}
	found, _ := filepath.Glob(filepath.Join(hostCache, "*", "*", "c.txt"))
	if len(found) != 1 {
		t.Fatalf("cache directory not under cache_dir %s: %v", hostCache, found)
	}
	j.mustRun("rm -rf /cache/* /extra/*") // files of root, in the test's temporary directory

	// disable_cache: the cache directory and /path volumes live as long as the job.
	p2 := newProvider(t, cli, config.Docker{DisableCache: true, Volumes: []string{"/extra"}}, short)
	j1 := mustPrepare(t, p2, opts(short, 31, job()))
	j1.mustRun("echo c > /cache/c.txt; echo e > /extra/e.txt")
	if err := j1.e.Cleanup(context.Background()); err != nil {
		t.Fatal(err)
	}
	j2 := mustPrepare(t, p2, opts(short, 32, job()))
	if out := j2.mustRun("cat /cache/c.txt /extra/e.txt 2>&1 || echo gone"); !strings.Contains(out, "gone") || strings.Contains(out, "c\n") {
		t.Fatalf("disable_cache kept data: %s", out)
	}
}

func TestContainerSettings(t *testing.T) {
	t.Parallel()
	cli := dockerClient(t, busybox, httpd)
	const short = "settings1"
	p := newProvider(t, cli, config.Docker{
		// privileged is not tested: privileged containers cannot start on
		// the development machines ("unable to apply caps").
		CapAdd: []string{"NET_ADMIN"}, CapDrop: []string{"MKNOD"}, SecurityOpt: []string{"no-new-privileges"},
		ShmSize: 128 << 20, DNS: []string{"192.0.2.53"}, Devices: []string{"/dev/null:/dev/berth-null:r"},
		ContainerLabels: map[string]string{"team": "ci-$CI_PROJECT_NAME", LabelManaged: "false"},
		ServicesTmpfs:   map[string]string{"/svc-tmp": ""},
	}, short)
	j := mustPrepare(t, p, opts(short, 33, &runnerapi.JobResponse{
		Image:     &runnerapi.Image{Name: busybox},
		Variables: []runnerapi.Variable{{Key: "CI_PROJECT_NAME", Value: "proj"}},
		Services:  []runnerapi.Image{{Name: httpd}},
	}))
	j.mustRun("test -c /dev/berth-null")
	cs, err := cli.ContainerList(context.Background(), container.ListOptions{Filters: filters.NewArgs(filters.Arg("label", LabelShortToken+"="+short))})
	if err != nil || len(cs) != 2 {
		t.Fatalf("containers %v %v", cs, err)
	}
	for _, c := range cs {
		ins, err := cli.ContainerInspect(context.Background(), c.ID)
		if err != nil {
			t.Fatal(err)
		}
		l := ins.Config.Labels
		if l["team"] != "ci-proj" || l[LabelManaged] != "true" || l[LabelSystemID] != "s_dockertest" || l[labelGitLab+"job.id"] != "33" {
			t.Errorf("%s labels %v", c.Names, l)
		}
		hc := ins.HostConfig
		if len(hc.DNS) != 1 {
			t.Errorf("%s: dns %v", c.Names, hc.DNS)
		}
		switch l[LabelType] {
		case typeBuild:
			if hc.ShmSize != 128<<20 || len(hc.CapAdd) != 1 || len(hc.CapDrop) != 1 || len(hc.SecurityOpt) != 1 || hc.Init == nil || !*hc.Init {
				t.Errorf("build container host config %+v", hc)
			}
		case typeService:
			if _, ok := hc.Tmpfs["/svc-tmp"]; !ok || l[labelGitLabSvc] != "berth-test/httpd" || l[labelGitLabSvcV] != "latest" {
				t.Errorf("service container: tmpfs %v labels %v", hc.Tmpfs, l)
			}
		default:
			t.Errorf("unexpected container type %q", l[LabelType])
		}
	}
}

func TestDynamicHelperInBusybox(t *testing.T) {
	cli := dockerClient(t, busybox)
	if testing.Short() {
		t.Skip("builds berth")
	}
	goTool := testenv.LookPath(t, "go")
	bin := filepath.Join(t.TempDir(), "berth")
	build := exec.Command(goTool, "build", "-o", bin, "./cmd/berth")
	build.Dir = moduleRoot(t)
	build.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building berth: %v\n%s", err, out)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	interp := ""
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			b, _ := io.ReadAll(prog.Open())
			interp = strings.TrimRight(string(b), "\x00")
		}
	}
	f.Close()
	if interp == "" {
		t.Log("berth is statically linked here; the helper is mounted as is")
	}
	const short = "helper001"
	p := newProvider(t, cli, config.Docker{}, short, func(o *Options) { o.Helper = bin })
	j := mustPrepare(t, p, opts(short, 16, &runnerapi.JobResponse{Image: &runnerapi.Image{Name: busybox}}))
	// Its usage, and exit status 2 for a command it does not know.
	out := j.mustRun(fmt.Sprintf(`%[1]q helper; echo "rc=$?"; %[1]q helper no-such-command; echo "rc=$?"`, j.env.Helper))
	if !strings.Contains(out, "berth helper") || !strings.Contains(out, "cache-archive") || !strings.Contains(out, "rc=2") {
		t.Fatalf("helper in busybox (interpreter %q): %s", interp, out)
	}
	// The helper really works: a cache archive round trip in the image.
	out = j.mustRun(fmt.Sprintf(`mkdir -p src && echo payload > src/f.txt && %[1]q helper cache-archive --dir . --file /tmp/c.zip --path 'src/*' && rm -rf src && %[1]q helper cache-extract --dir . --file /tmp/c.zip && cat src/f.txt`, j.env.Helper))
	if !strings.Contains(out, "payload") {
		t.Fatalf("cache round trip with the helper: %s", out)
	}
}

func moduleRoot(t *testing.T) string {
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("go.mod not found")
		}
		dir = parent
	}
}

func TestUserAndShell(t *testing.T) {
	t.Parallel()
	cli := dockerClient(t, busybox)
	const short = "usershel1"
	p := newProvider(t, cli, config.Docker{}, short)
	j := mustPrepare(t, p, opts(short, 17, &runnerapi.JobResponse{Image: &runnerapi.Image{Name: busybox,
		ExecutorOpts: &runnerapi.ExecutorOpts{Docker: &runnerapi.DockerOpts{User: "nobody"}}}}))
	if j.env.Shell != "sh" {
		t.Errorf("shell %q in busybox, want sh", j.env.Shell)
	}
	out := j.mustRun(`id -u; echo x > owned.txt && echo wrote; ls -ld "$PWD.tmp" | cut -c1-10`)
	if !strings.Contains(out, "65534") || !strings.Contains(out, "wrote") || !strings.Contains(out, "drwx------") {
		t.Fatalf("as nobody: %s", out)
	}
	// Escaped processes of a non-root stage are stopped as well.
	out = j.mustRun(`setsid sh -c 'echo "pid:$$" > esc.pid; exec sleep 1000' </dev/null >/dev/null 2>&1 & while ! test -s esc.pid; do sleep 0.05; done; cat esc.pid`)
	pid := strings.TrimPrefix(strings.TrimSpace(out), "pid:")
	if inBuild(cli, short, aliveScript, pid) {
		t.Fatalf("escaped process %s of a non-root stage survives", pid)
	}
	// The runner's user wins over the job's.
	p2 := newProvider(t, cli, config.Docker{User: "root"}, short)
	j2 := mustPrepare(t, p2, opts(short, 18, &runnerapi.JobResponse{Image: &runnerapi.Image{Name: busybox,
		ExecutorOpts: &runnerapi.ExecutorOpts{Docker: &runnerapi.DockerOpts{User: "nobody"}}}}))
	if out := j2.mustRun("id -u"); strings.TrimSpace(out) != "0" {
		t.Fatalf("docker.user root: id -u = %q", out)
	}
}

func TestBashImage(t *testing.T) {
	t.Parallel()
	cli := dockerClient(t, debian)
	const short = "bashimg01"
	p := newProvider(t, cli, config.Docker{Memory: "256m", CPUs: "0.5", ExtraHosts: []string{"example.invalid:10.1.2.3"}, DNSSearch: []string{"berth.test"}}, short)
	j := mustPrepare(t, p, opts(short, 19, &runnerapi.JobResponse{Image: &runnerapi.Image{Name: debian}}))
	if j.env.Shell != "bash" {
		t.Fatalf("shell %q in debian, want bash", j.env.Shell)
	}
	out := j.mustRun(`echo "$BASH_VERSION"; git --version; grep example.invalid /etc/hosts; grep berth.test /etc/resolv.conf; cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max`)
	for _, want := range []string{"git version", "10.1.2.3", "berth.test", strconv.Itoa(256 << 20)} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.HasPrefix(strings.TrimSpace(out), "\n") || !strings.Contains(out, ".") {
		t.Errorf("not bash: %s", out)
	}
}

func TestEntrypoint(t *testing.T) {
	t.Parallel()
	cli := dockerClient(t, busybox)
	const short = "entrypt01"
	p := newProvider(t, cli, config.Docker{}, short)
	// An entrypoint that prepares something and runs its arguments.
	j := mustPrepare(t, p, opts(short, 20, &runnerapi.JobResponse{Image: &runnerapi.Image{Name: busybox,
		Entrypoint: []string{"sh", "-c", `echo entrypoint-ran > /tmp/entry; exec "$@"`, "entry"}}}))
	if out := j.mustRun("cat /tmp/entry"); !strings.Contains(out, "entrypoint-ran") {
		t.Fatal(out)
	}
	// One that does not: a clear error.
	_, err := prepare(t, p, opts(short, 21, &runnerapi.JobResponse{Image: &runnerapi.Image{Name: busybox,
		Entrypoint: []string{"sh", "-c", "echo entrypoint-quits"}}}))
	if err == nil || !strings.Contains(err.Error(), "not running") || !strings.Contains(err.Error(), "entrypoint-quits") {
		t.Fatalf("entrypoint that exits: %v", err)
	}
}

func TestScriptTransport(t *testing.T) {
	t.Parallel()
	cli := dockerClient(t, busybox)
	const short = "scripts01"
	p := newProvider(t, cli, config.Docker{}, short)
	j := mustPrepare(t, p, opts(short, 24, &runnerapi.JobResponse{Image: &runnerapi.Image{Name: busybox}}))
	// Small scripts travel in the exec's environment: byte-exact, and
	// the variable does not reach the script.
	tricky := "printf '%s|' 'a%sb' \"back\\\\slash\" \"$'x'\"; echo \"[${BERTH_STAGE_SCRIPT-unset}]\"; read -r line || echo stdin-empty"
	if out := j.mustRun(tricky); !strings.Contains(out, "a%sb|back\\slash|") || !strings.Contains(out, "[unset]") || !strings.Contains(out, "stdin-empty") {
		t.Fatalf("tricky script: %q", out)
	}
	// Large ones are copied into TmpDir.
	big := "# " + strings.Repeat("x", 200<<10) + "\necho big-script-ran; ls " + j.env.TmpDir + "\n"
	out := j.mustRun(big)
	if !strings.Contains(out, "big-script-ran") {
		t.Fatalf("large script: %q", out)
	}
	if out := j.mustRun("ls -A " + j.env.TmpDir); strings.Count(out, "stage-") != 1 {
		t.Fatalf("stage scripts left in TmpDir: %q", out)
	}
}

func TestNetworkModeBridge(t *testing.T) {
	t.Parallel()
	cli := dockerClient(t, busybox, httpd)
	const short = "bridge001"
	p := newProvider(t, cli, config.Docker{NetworkMode: "bridge"}, short)
	j := mustPrepare(t, p, opts(short, 22, &runnerapi.JobResponse{Image: &runnerapi.Image{Name: busybox}, Services: []runnerapi.Image{{Name: httpd, Alias: "web"}}}))
	if out := j.mustRun("wget -q -O - http://web:8080/"); !strings.Contains(out, "hello from the httpd service") {
		t.Fatal(out)
	}
	ns, _ := cli.NetworkList(context.Background(), network.ListOptions{Filters: filters.NewArgs(filters.Arg("label", LabelShortToken+"="+short))})
	if len(ns) != 0 {
		t.Errorf("network_mode bridge created networks: %v", ns)
	}
}

func TestHostAddress(t *testing.T) {
	t.Parallel()
	cli := dockerClient(t, busybox)
	const short = "hostaddr1"
	p := newProvider(t, cli, config.Docker{}, short)
	addr, err := p.HostAddress(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if net.ParseIP(addr) == nil {
		t.Fatalf("HostAddress %q is not an IP", addr)
	}
	l, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			io.WriteString(c, "host-reached\n")
			c.Close()
		}
	}()
	j := mustPrepare(t, p, opts(short, 23, &runnerapi.JobResponse{Image: &runnerapi.Image{Name: busybox}}))
	host, port, _ := net.SplitHostPort(l.Addr().String())
	if out := j.mustRun("nc -w 5 " + host + " " + port + " </dev/null"); !strings.Contains(out, "host-reached") {
		t.Fatalf("a job on its own network did not reach %s: %s", l.Addr(), out)
	}
}

func TestDescribe(t *testing.T) {
	var p Provider
	var info runnerapi.Info
	p.Describe(&info)
	f := info.Features
	if info.Executor != "docker" || !f.Image || !f.Services || !f.ServiceVariables || !f.ServiceMultipleAliases || !f.ImageExecutorOpts || !f.Variables || !f.Artifacts {
		t.Fatalf("%+v", info)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	_, err := New(context.Background(), Options{Config: config.Docker{Memory: "lots"}, StateDir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "docker.memory") {
		t.Fatalf("New: %v", err)
	}
}

// BenchmarkPrepareRunCleanup is one job with a local busybox image:
// Prepare, a one-line script, Cleanup. It reports the time from Prepare's
// start to the script's first output line ("first-line-ms").
func BenchmarkPrepareRunCleanup(b *testing.B) {
	cli := dockerClient(b, busybox)
	const short = "bench0001"
	p := newProvider(b, cli, config.Docker{}, short)
	ctx := context.Background()
	var first time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		e, _ := p.Create(ctx)
		if _, err := e.Prepare(ctx, opts(short, int64(1000+i), &runnerapi.JobResponse{Image: &runnerapi.Image{Name: busybox}})); err != nil {
			b.Fatal(err)
		}
		w := &firstWrite{}
		if err := e.Run(ctx, executor.Command{Stage: "step_script", Script: "echo hello", Output: w}); err != nil {
			b.Fatal(err)
		}
		first += w.at.Sub(start)
		if err := e.Cleanup(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(first.Milliseconds())/float64(b.N), "first-line-ms")
}

// BenchmarkRun is one stage in a prepared job.
func BenchmarkRun(b *testing.B) {
	cli := dockerClient(b, busybox)
	const short = "bench0002"
	p := newProvider(b, cli, config.Docker{}, short)
	ctx := context.Background()
	e, _ := p.Create(ctx)
	if _, err := e.Prepare(ctx, opts(short, 2000, &runnerapi.JobResponse{Image: &runnerapi.Image{Name: busybox}})); err != nil {
		b.Fatal(err)
	}
	defer e.Cleanup(ctx)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := e.Run(ctx, executor.Command{Stage: "step_script", Script: "echo hello", Output: io.Discard}); err != nil {
			b.Fatal(err)
		}
	}
}

type firstWrite struct{ at time.Time }

func (w *firstWrite) Write(p []byte) (int, error) {
	if w.at.IsZero() {
		w.at = time.Now()
	}
	return len(p), nil
}

// TestHelperVolumeForARemoteEngine: with HelperVolume the helper reaches
// the job through a volume filled over the Engine API (an engine on
// another host cannot see this host's files), once per engine; a fill that
// broke off (no marker) is done again; the cgroup parents are applied.
func TestHelperVolumeForARemoteEngine(t *testing.T) {
	cli := dockerClient(t, busybox)
	ctx := context.Background()
	const short = "hvolume01"
	var vol string
	cleanup := func() {
		if vol != "" {
			cli.VolumeRemove(ctx, vol+".complete", true)
			cli.VolumeRemove(ctx, vol, true)
		}
	}
	mk := func() *Provider {
		return newProvider(t, cli, config.Docker{}, short, func(o *Options) {
			o.HelperVolume = true
			o.CgroupParent = func(slot int) (string, string) { return fmt.Sprintf("berth-test-%d/slot-%d", os.Getpid(), slot), "" }
		})
	}
	p := mk()
	vol = p.helperVolume
	t.Cleanup(cleanup)
	cleanup() // a previous run's
	// A broken-off fill: the volume without its marker.
	if _, err := cli.VolumeCreate(ctx, volume.CreateOptions{Name: vol}); err != nil {
		t.Fatal(err)
	}
	parent := fmt.Sprintf("berth-test-%d", os.Getpid())
	t.Cleanup(func() {
		// The engine leaves the parents it created.
		dirs, _ := filepath.Glob("/sys/fs/cgroup/*/" + parent + "/slot-*")
		more, _ := filepath.Glob("/sys/fs/cgroup/" + parent + "/slot-*")
		for _, d := range append(dirs, more...) {
			os.Remove(d)
			os.Remove(filepath.Dir(d))
		}
	})
	j := mustPrepare(t, p, opts(short, 31, &runnerapi.JobResponse{Image: &runnerapi.Image{Name: busybox}}))
	out := j.mustRun(`test -x /usr/local/berth/berth && echo helper-present; grep -q ` + parent + `/slot-0 /proc/self/cgroup && echo in-slot-cgroup`)
	if !strings.Contains(out, "helper-present") {
		t.Fatalf("the helper is not in the job's container: %q", out)
	}
	if !strings.Contains(out, "in-slot-cgroup") {
		t.Errorf("the build container is not under its cgroup parent %s/slot-0: %q", parent, out)
	}
	ins, err := cli.VolumeInspect(ctx, vol+".complete")
	if err != nil || ins.Labels[LabelManaged] != "true" {
		t.Fatalf("marker volume: %v %+v", err, ins)
	}
	// A new provider (a restarted runner) finds the volume complete.
	p2 := mk()
	if err := p2.ensureHelperVolume(ctx, "image-that-does-not-exist"); err != nil || !p2.helperReady {
		t.Fatalf("a complete helper volume was not reused: %v", err)
	}
}

// CI_DEBUG_SERVICES (DebugServices): every service's stdout and stderr go
// into the job's log, each line prefixed with the service's aliases, until
// Cleanup; without it nothing of theirs does.
func TestDebugServicesLogs(t *testing.T) {
	t.Parallel()
	cli := dockerClient(t, busybox)
	const short = "svclogs01"
	p := newProvider(t, cli, config.Docker{}, short)
	job := func() *runnerapi.JobResponse {
		return &runnerapi.JobResponse{Image: &runnerapi.Image{Name: busybox}, Services: []runnerapi.Image{{
			Name: busybox, Alias: "chatty", Entrypoint: []string{"sh", "-c"},
			Command: []string{"echo svc-hello; echo svc-err >&2; exec sleep 3600"},
		}}}
	}
	for _, debug := range []bool{true, false} {
		var out testenv.SyncBuffer
		o := opts(short, 7, job())
		o.Output, o.DebugServices = &out, debug
		j := mustPrepare(t, p, o)
		deadline := time.Now().Add(20 * time.Second)
		for debug && !(strings.Contains(out.String(), "svc-hello") && strings.Contains(out.String(), "svc-err")) && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if !debug {
			j.mustRun("sleep 1") // time for lines that should not come
		}
		got := out.String()
		if debug {
			for _, want := range []string{"svc-hello", "svc-err"} {
				i := strings.Index(got, want)
				if i < 0 {
					t.Fatalf("no %q in the log:\n%s", want, got)
				}
				line := got[strings.LastIndexByte(got[:i], '\n')+1 : i]
				if !strings.Contains(line, "[service:chatty] ") {
					t.Errorf("line %q of %s is not prefixed with the service", line, want)
				}
			}
		} else if strings.Contains(got, "svc-hello") || strings.Contains(got, "[service:") {
			t.Errorf("service output without CI_DEBUG_SERVICES:\n%s", got)
		}
		if err := j.e.Cleanup(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}
