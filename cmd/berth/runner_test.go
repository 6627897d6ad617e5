package main

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator"
	"github.com/berthci/berth/coordinator/client"
	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/internal/testenv"
	"github.com/berthci/berth/runner/config"
	"github.com/berthci/berth/runner/network"
	"github.com/berthci/berth/runnerapi"
)

func TestRunnerCommandsAgainstARealCoordinator(t *testing.T) {
	ctx := context.Background()
	srv, closeSrv, err := openCoordinator(ctx, slog.New(slog.DiscardHandler), t.TempDir(), coordinator.Config{LongPollTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer closeSrv()
	adminTok, err := srv.EnsureAdminToken(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	admin := client.New(hs.URL, adminTok)
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "config.toml")

	// Legacy registration token.
	reg, err := admin.ResetRegistrationToken(ctx, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	out, err := runCLI(t, "runner", "register", "-c", cfgPath, "--url", hs.URL, "--token", reg, "--name", "legacy",
		"--tag-list", "a,b", "--builds-dir", filepath.Join(dir, "builds"))
	if err != nil || !strings.Contains(out, "registered successfully") {
		t.Fatalf("register: %q %v", out, err)
	}
	// glrt- token: the verify flow.
	created, err := admin.CreateRunner(ctx, restapi.CreateRunnerRequest{RunnerType: "instance_type"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := runCLI(t, "runner", "register", "-c", cfgPath, "--url", hs.URL, "--token", created.Token, "--tag-list", "x"); err == nil {
		t.Fatal("server-owned settings accepted with a glrt- token")
	}
	if _, err := runCLI(t, "runner", "register", "-c", cfgPath, "--url", hs.URL, "--token", created.Token, "--name", "modern"); err != nil {
		t.Fatal(err)
	}
	cfg, warns, err := config.Load(cfgPath)
	if err != nil || len(warns) != 0 {
		t.Fatalf("%v %v", err, warns)
	}
	if len(cfg.Runners) != 2 || !strings.HasPrefix(cfg.Runners[0].Token, "glrtr-") || cfg.Runners[0].ID == 0 ||
		cfg.Runners[1].Token != created.Token || cfg.Runners[1].ID == 0 || cfg.Runners[1].TokenObtainedAt.IsZero() {
		t.Fatalf("config after register: %+v %+v", cfg.Runners[0], cfg.Runners[1])
	}
	if b, err := os.ReadFile(filepath.Join(dir, ".runner_system_id")); err != nil || !config.ValidSystemID(string(b)) {
		t.Fatalf(".runner_system_id: %q %v", b, err)
	}

	out, err = runCLI(t, "runner", "list", "-c", cfgPath)
	if err != nil || !strings.Contains(out, "legacy") || !strings.Contains(out, "modern") {
		t.Fatalf("list: %q %v", out, err)
	}
	out, err = runCLI(t, "runner", "verify", "-c", cfgPath)
	if err != nil || strings.Count(out, "is valid") != 2 {
		t.Fatalf("verify: %q %v", out, err)
	}

	// Unregister both: the legacy runner is deleted, the glrt- runner
	// keeps existing (only this machine's manager goes).
	if out, err = runCLI(t, "runner", "unregister", "-c", cfgPath, "--all-runners"); err != nil {
		t.Fatalf("unregister: %q %v", out, err)
	}
	runners, err := admin.ListRunners(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(runners) != 1 {
		t.Fatalf("runners after unregister: %+v", runners)
	}
	cfg, _, err = config.Load(cfgPath)
	if err != nil || len(cfg.Runners) != 0 {
		t.Fatalf("config after unregister: %+v %v", cfg, err)
	}
}

func TestRunSingleRunsOneJob(t *testing.T) {
	testenv.LookPath(t, "bash")
	ctx := context.Background()
	srv, closeSrv, err := openCoordinator(ctx, slog.New(slog.DiscardHandler), t.TempDir(), coordinator.Config{LongPollTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer closeSrv()
	adminTok, _ := srv.EnsureAdminToken(ctx, "")
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	admin := client.New(hs.URL, adminTok)
	created, err := admin.CreateRunner(ctx, restapi.CreateRunnerRequest{RunnerType: "instance_type"})
	if err != nil {
		t.Fatal(err)
	}
	job, err := srv.Enqueue(ctx, dispatch.JobSpec{Name: "single", ProjectID: 1,
		Steps: []runnerapi.Step{{Name: "script", Script: []string{"echo from-run-single"}, When: "on_success"}}})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	done := make(chan error, 1)
	go func() {
		_, err := runCLI(t, "runner", "run-single", "--url", hs.URL, "--token", created.Token, "--builds-dir", filepath.Join(dir, "b"),
			"--cache-dir", filepath.Join(dir, "c"), "--max-builds", "1", "--check-interval", "50ms", "--log-level", "error")
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("run-single --max-builds 1 did not exit")
	}
	j, err := admin.Job(ctx, 1, job.ID)
	if err != nil || j.Status != "success" {
		t.Fatalf("job %+v %v", j, err)
	}
	var b strings.Builder
	if err := admin.Trace(ctx, 1, job.ID, &b); err != nil || !strings.Contains(b.String(), "from-run-single") {
		t.Fatalf("trace %q %v", b.String(), err)
	}
}

func TestHelperCommandUsage(t *testing.T) {
	if _, err := runCLI(t, "helper", "no-such-command"); err == nil {
		t.Fatal("unknown helper command accepted")
	} else if exitCode(err) != 2 {
		t.Fatalf("exit code %d, want 2", exitCode(err))
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "f.txt"), []byte("x"), 0o644)
	zip := filepath.Join(dir, "cache", "k", "cache.zip")
	if _, err := runCLI(t, "helper", "cache-archive", "--dir", dir, "--file", zip, "--path", "*.txt"); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	if _, err := runCLI(t, "helper", "cache-extract", "--dir", out, "--file", zip); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(out, "f.txt")); err != nil || string(b) != "x" {
		t.Fatalf("%q %v", b, err)
	}
}

// TestRegisterWritesTheExecutorSection: gitlab-runner register's executor
// flags (--docker-image, --ssh-host, --custom-run-exec, …) write the
// executor's section.
func TestRegisterWritesTheExecutorSection(t *testing.T) {
	ctx := context.Background()
	hs, admin := servedCoordinator(t, coordinator.Config{LongPollTimeout: time.Second}, false)
	cfgPath := filepath.Join(t.TempDir(), "config.toml")
	for _, args := range [][]string{
		{"--executor", "docker", "--docker-image", "alpine:3.20", "--docker-volumes", "/cache", "--docker-volumes", "/srv:/srv:ro", "--docker-pull-policy", "if-not-present"},
		{"--executor", "ssh", "--ssh-host", "build-1.example", "--ssh-port", "2222", "--ssh-user", "ci", "--ssh-identity-file", "/etc/berth/id_ed25519"},
		{"--executor", "custom", "--custom-run-exec", "/opt/driver/run.sh", "--custom-prepare-exec", "/opt/driver/prepare.sh"},
		{"--executor", "instance", "--autoscaler-plugin", "local", "--autoscaler-max-instances", "3", "--autoscaler-capacity-per-instance", "2"},
		{"--executor", "plugin", "--plugin-name", "python"},
	} {
		created, err := admin.CreateRunner(ctx, restapi.CreateRunnerRequest{RunnerType: "instance_type"})
		if err != nil {
			t.Fatal(err)
		}
		if out, err := runCLI(t, append([]string{"runner", "register", "-c", cfgPath, "--url", hs.URL, "--token", created.Token}, args...)...); err != nil {
			t.Fatalf("register %v: %q %v", args, out, err)
		}
	}
	if _, err := runCLI(t, "runner", "register", "-c", cfgPath, "--url", hs.URL, "--token", "glrt-x", "--executor", "ssh"); err == nil {
		t.Error("an ssh runner without --ssh-host was registered")
	}
	cfg, warns, err := config.Load(cfgPath)
	if _, err := runCLI(t, "runner", "register", "-c", cfgPath, "--url", hs.URL, "--token", "glrt-x", "--executor", "instance"); err == nil {
		t.Error("an instance runner without --autoscaler-plugin was registered")
	}
	if err != nil || len(warns) != 0 || len(cfg.Runners) != 5 {
		t.Fatalf("%+v %v %v", cfg, warns, err)
	}
	d, s, c := cfg.Runners[0].Docker, cfg.Runners[1].SSH, cfg.Runners[2].Custom
	if d == nil || d.Image != "alpine:3.20" || len(d.Volumes) != 2 || len(d.PullPolicy) != 1 || d.PullPolicy[0] != "if-not-present" {
		t.Errorf("docker section %+v", d)
	}
	if s == nil || s.Host != "build-1.example" || s.Port != "2222" || s.User != "ci" || s.IdentityFile != "/etc/berth/id_ed25519" {
		t.Errorf("ssh section %+v", s)
	}
	if c == nil || c.RunExec != "/opt/driver/run.sh" || c.PrepareExec != "/opt/driver/prepare.sh" {
		t.Errorf("custom section %+v", c)
	}
	if a := cfg.Runners[3].Autoscaler; a == nil || a.Plugin != "local" || a.MaxInstances != 3 || a.CapacityPerInstance != 2 {
		t.Errorf("autoscaler section %+v", a)
	}
	if p := cfg.Runners[4].Plugin; p == nil || p.Name != "python" {
		t.Errorf("plugin section %+v", p)
	}
}

// An idle runner manager of Berth's own holds its poll at Berth's
// coordinator: the 204 "no job" carries the queue version in a header and
// no body (nor Content-Type), and the next request must echo it, or the
// coordinator answers at once and the runner polls every check_interval.
func TestIdleRunnerLongPollsBerthsCoordinator(t *testing.T) {
	ctx := context.Background()
	srv, closeSrv, err := openCoordinator(ctx, slog.New(slog.DiscardHandler), t.TempDir(), coordinator.Config{LongPollTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer closeSrv()
	adminTok, _ := srv.EnsureAdminToken(ctx, "")
	var mu sync.Mutex
	var sent []string
	inner := srv.Handler()
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/api/v4/jobs/request" {
			b, _ := io.ReadAll(r.Body)
			var req runnerapi.JobRequest
			_ = json.Unmarshal(b, &req)
			mu.Lock()
			sent = append(sent, req.LastUpdate)
			mu.Unlock()
			r.Body = io.NopCloser(bytes.NewReader(b))
		}
		inner.ServeHTTP(w, r)
	}))
	defer hs.Close()
	created, err := client.New(hs.URL, adminTok).CreateRunner(ctx, restapi.CreateRunnerRequest{RunnerType: "instance_type"})
	if err != nil {
		t.Fatal(err)
	}
	c := network.New(network.Options{})
	rc := network.RunnerCredentials{URL: hs.URL, Token: created.Token}
	for range 2 {
		if job, err := c.RequestJob(ctx, rc, "s_0123456789ab", nil); err != nil || job != nil {
			t.Fatalf("job %v err %v", job, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(sent) != 2 || sent[0] != "" || sent[1] == "" {
		t.Fatalf("last_update sent %q: the second request must echo the first 204's", sent)
	}
}

// register --tls-ca-file verifies the token against a coordinator whose
// certificate comes from that authority and writes tls-ca-file into the
// entry; without it the certificate is refused.
func TestRegisterWithTLSCAFile(t *testing.T) {
	ctx := context.Background()
	hs, admin := servedCoordinator(t, coordinator.Config{LongPollTimeout: time.Second}, true)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: hs.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	created, err := admin.CreateRunner(ctx, restapi.CreateRunnerRequest{RunnerType: "instance_type"})
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(t.TempDir(), "config.toml")
	if out, err := runCLI(t, "runner", "register", "-c", cfgPath, "--url", hs.URL, "--token", created.Token); err == nil || !strings.Contains(out+err.Error(), "certificate") {
		t.Fatalf("register without --tls-ca-file: %q %v, want a certificate error", out, err)
	}
	if out, err := runCLI(t, "runner", "register", "-c", cfgPath, "--url", hs.URL, "--token", created.Token, "--tls-ca-file", ca); err != nil {
		t.Fatalf("register --tls-ca-file: %q %v", out, err)
	}
	cfg, warns, err := config.Load(cfgPath)
	if err != nil || len(warns) != 0 || len(cfg.Runners) != 1 || cfg.Runners[0].TLSCAFile != ca {
		t.Fatalf("config %+v, warnings %v, %v", cfg, warns, err)
	}
}

// servedCoordinator opens a coordinator with cfg, serves it (over TLS
// with httptest's own authority when tls) and returns its server and an
// admin client; both are closed when t ends.
func servedCoordinator(t *testing.T, cfg coordinator.Config, tls bool) (*httptest.Server, *client.Client) {
	t.Helper()
	ctx := context.Background()
	srv, closeSrv, err := openCoordinator(ctx, slog.New(slog.DiscardHandler), t.TempDir(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closeSrv)
	adminTok, err := srv.EnsureAdminToken(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewUnstartedServer(srv.Handler())
	if tls {
		hs.StartTLS()
	} else {
		hs.Start()
	}
	t.Cleanup(hs.Close)
	admin := client.New(hs.URL, adminTok)
	admin.HTTP = hs.Client()
	return hs, admin
}

// run --working-directory: the configuration named relatively is read
// from where it was named, then the runner works in the directory; a
// directory that is not there is an error naming the flag. (gitlab-runner's
// service units pass --service and --user too.)
func TestRunWorkingDirectory(t *testing.T) {
	t.Chdir(t.TempDir()) // restored after the test, whatever the command does
	if err := os.WriteFile("config.toml", []byte("concurrent = 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	_, err := runCLI(t, "runner", "run", "-c", "config.toml", "--working-directory", work, "--service", "gitlab-runner", "--user", "nobody")
	if err == nil || !strings.Contains(err.Error(), "config.toml has no [[runners]]") {
		t.Fatalf("error %v, want the configuration read and found without runners", err)
	}
	if wd, _ := os.Getwd(); wd != work {
		t.Errorf("working directory %s, want %s", wd, work)
	}
	if _, err := runCLI(t, "runner", "run", "-c", "config.toml", "-d", filepath.Join(work, "missing")); err == nil ||
		!strings.Contains(err.Error(), "--working-directory") {
		t.Errorf("a missing working directory: %v", err)
	}
}
