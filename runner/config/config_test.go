package config

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"

	econfig "github.com/berthci/berth/executor/config"
)

const gitlabConfig = `concurrent = 4
check_interval = 2
log_level = "info"
listen_address = "127.0.0.1:9252"
sentry_dsn = "x"

[session_server]
  session_timeout = 1800

[[runners]]
  name = "host-1"
  url = "https://gitlab.example.com/"
  id = 42
  token = "glrt-t1_abcdefghijklmnop"
  token_obtained_at = 2026-01-01T00:00:00Z
  token_expires_at = 2026-01-05T00:00:00Z
  executor = "shell"
  limit = 2
  request_concurrency = 3
  builds_dir = "/srv/builds"
  environment = ["A=1", "B=two"]
  output_limit = 8192
  unhealthy_interval = "10m"
  post_clone_script = "x"
  [runners.feature_flags]
    FF_X = true
  [runners.cache]
    Type = "gcs"
    [runners.cache.gcs]
      BucketName = "b"
  [runners.docker]
    privileged = true
    image = "alpine"
    gpus = "all"

[[runners]]
  name = "host-2"
  url = "http://127.0.0.1:8080"
  token = "glrt-second"
  executor = "shell"
  mystery = 1
`

// gitlab-runner's job-stage keys and connection_max_age decode without a warning.
func TestStageKeys(t *testing.T) {
	c, warns, err := Parse("config.toml", []byte(`connection_max_age = "5m"
[[runners]]
  name = "r"
  url = "http://127.0.0.1:8080"
  token = "glrt-x"
  executor = "docker"
  clean_git_config = false
  prepare_timeout = "90s"
  get_sources_timeout = "2m30s"
  strict_check_interval = true
`))
	if err != nil || len(warns) != 0 {
		t.Fatalf("%v %v", err, warns)
	}
	r := c.Runners[0]
	if r.CleanGitConfig == nil || *r.CleanGitConfig || r.PrepareTimeout == nil || *r.PrepareTimeout != 90*time.Second ||
		r.GetSourcesTimeout == nil || *r.GetSourcesTimeout != 150*time.Second || !r.StrictCheckInterval {
		t.Fatalf("runner %+v", r)
	}
	if c.EffectiveConnectionMaxAge() != 5*time.Minute || (&Config{}).EffectiveConnectionMaxAge() != DefaultConnectionMaxAge {
		t.Errorf("connection_max_age %v", c.ConnectionMaxAge)
	}
	if _, _, err := Parse("config.toml", []byte("[[runners]]\n  name = \"r\"\n  prepare_timeout = \"soon\"\n")); err == nil ||
		!strings.Contains(err.Error(), "prepare_timeout") {
		t.Errorf("a malformed prepare_timeout: %v", err)
	}
}

func TestLoadGitLabConfigWarnsAboutEveryUnsupportedKey(t *testing.T) {
	c, warns, err := Parse("config.toml", []byte(gitlabConfig))
	if err != nil {
		t.Fatal(err)
	}
	if c.Concurrent != 4 || c.CheckIntervalDuration() != 2*time.Second || len(c.Runners) != 2 {
		t.Fatalf("config %+v", c)
	}
	r := c.Runners[0]
	if r.ID != 42 || r.Limit != 2 || r.EffectiveRequestConcurrency() != 3 || r.OutputLimitBytes() != 8192*1024 ||
		r.EffectiveUnhealthyInterval() != 10*time.Minute || !r.FeatureFlag("FF_X") || len(r.Environment) != 2 {
		t.Fatalf("runner %+v", r)
	}
	got := map[string]Warning{}
	for _, w := range warns {
		got[w.Key] = w
	}
	want := map[string]int{ // key → line
		"sentry_dsn":                     5,
		"session_server":                 7,
		"session_server.session_timeout": 8,
		"runners.post_clone_script":      24,
		"runners[0].cache.Type":          28,
		"runners.cache.gcs":              29,
		"runners.cache.gcs.BucketName":   30,
		"runners.docker.gpus":            34,
		"runners.mystery":                41,
	}
	for k, line := range want {
		w, ok := got[k]
		if !ok {
			t.Errorf("no warning for %s (got %v)", k, warns)
			continue
		}
		if w.Line != line || w.File != "config.toml" {
			t.Errorf("warning %s at %s:%d, want line %d", k, w.File, w.Line, line)
		}
	}
	if len(got) != len(want) {
		t.Errorf("warnings %v, want exactly %d keys", warns, len(want))
	}
	if !strings.Contains(got["runners.docker.gpus"].Msg, "docker executor") || !strings.Contains(got["runners.mystery"].Msg, "unknown key") ||
		!strings.Contains(got["runners.post_clone_script"].Msg, "not supported") {
		t.Errorf("messages: %v", warns)
	}
	if d := r.Docker; d == nil || !d.Privileged || d.Image != "alpine" {
		t.Errorf("docker section %+v", d)
	}
	if s := got["runners.docker.gpus"].String(); s != "config.toml:34: runners.docker.gpus: not supported by Berth's docker executor; ignored" {
		t.Errorf("warning string %q", s)
	}
}

func TestLoadErrorsNameFileLineAndKey(t *testing.T) {
	for _, tc := range []struct {
		name, doc string
		want      []string
	}{
		{"type", "concurrent = \"many\"\n", []string{"cfg.toml:1:", "concurrent", "incompatible types"}},
		{"syntax", "concurrent = 1\nfoo = = 2\n", []string{"cfg.toml:2:"}},
		{"validate", "concurrent = 1\n[[runners]]\n  url = \"ftp://x\"\n  token = \"t\"\n  executor = \"shell\"\n", []string{"cfg.toml:3:", "runners[0].url", "http(s)"}},
		{"missing key points at the entry", "concurrent = 1\n\n[[runners]]\n  url = \"http://x\"\n  executor = \"shell\"\n", []string{"cfg.toml:3:", "runners[0].token", "required"}},
		{"unknown executor", "[[runners]]\n url = \"http://x\"\n token = \"t\"\n executor = \"podman\"\n", []string{"cfg.toml:4:", "runners[0].executor", "unknown executor"}},
		{"concurrent zero", "concurrent = 0\n", []string{"cfg.toml:1:", "concurrent", "greater than 0"}},
		{"second runner", "[[runners]]\n url = \"http://x\"\n token = \"t\"\n executor = \"shell\"\n[[runners]]\n url = \"http://x\"\n token = \"t\"\n executor = \"shell\"\n limit = -1\n", []string{"cfg.toml:9:", "runners[1].limit"}},
		{"bad duration", "[[runners]]\n unhealthy_interval = \"soon\"\n", []string{"cfg.toml:2:", "unhealthy_interval"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := Parse("cfg.toml", []byte(tc.doc))
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Errorf("error %T is not a *FieldError", err)
			}
		})
	}
}

func TestUnsupportedExecutorLoadsWithAWarning(t *testing.T) {
	doc := "[[runners]]\n url = \"http://x\"\n token = \"t\"\n executor = \"shell\"\n[[runners]]\n url = \"http://x\"\n token = \"u\"\n executor = \"kubernetes\"\n"
	c, warns, err := Parse("cfg.toml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Runners) != 2 || len(warns) != 1 || warns[0].Key != "runners[1].executor" || warns[0].Line != 8 ||
		!strings.Contains(warns[0].Msg, "will not run jobs") {
		t.Fatalf("warnings %v", warns)
	}
}

func TestDefaults(t *testing.T) {
	c, _, err := Parse("c", []byte("[[runners]]\nurl=\"http://h\"\ntoken=\"t\"\nexecutor=\"shell\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	r := c.Runners[0]
	if c.Concurrent != 1 || c.CheckIntervalDuration() != 3*time.Second || c.ShutdownTimeoutDuration() != 30*time.Second ||
		r.EffectiveRequestConcurrency() != 1 || r.OutputLimitBytes() != 4096*1024 || r.EffectiveUnhealthyRequestsLimit() != 3 ||
		r.EffectiveUnhealthyInterval() != time.Hour || r.EffectiveFinalUpdateRetryLimit() != 10 || r.EffectiveShell() != "bash" {
		t.Fatalf("defaults not applied: %+v %+v", c, r)
	}
	if (&Config{ListenAddress: "0.0.0.0"}).MetricsAddress() != "0.0.0.0:9252" || (&Config{}).MetricsAddress() != "" {
		t.Fatal("metrics address default")
	}
}

func TestEnvExpansionKeptOnSave(t *testing.T) {
	t.Setenv("BERTH_TEST_URL", "http://expanded.example")
	dir := t.TempDir()
	p := filepath.Join(dir, "config.toml")
	doc := "concurrent = 1\n[[runners]]\nurl = \"$BERTH_TEST_URL\"\ntoken = \"glrt-old\"\nexecutor = \"shell\"\n[runners.docker]\nprivileged = true\n"
	if err := os.WriteFile(p, []byte(doc), 0o640); err != nil {
		t.Fatal(err)
	}
	c, _, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if c.Runners[0].URL != "http://expanded.example" {
		t.Fatalf("url %q", c.Runners[0].URL)
	}
	c.Runners[0].Token = "glrt-new"
	c.Runners[0].TokenObtainedAt = time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC)
	c.Runners[0].TokenExpiresAt = time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	if err := Save(p, c); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o640 {
		t.Errorf("mode %v, want 0640 kept", fi.Mode().Perm())
	}
	b, _ := os.ReadFile(p)
	var raw map[string]any
	if _, err := toml.Decode(string(b), &raw); err != nil {
		t.Fatalf("saved file does not parse: %v\n%s", err, b)
	}
	r := raw["runners"].([]map[string]any)[0]
	if r["url"] != "$BERTH_TEST_URL" || r["token"] != "glrt-new" {
		t.Errorf("saved runner %v", r)
	}
	if d, ok := r["docker"].(map[string]any); !ok || d["privileged"] != true {
		t.Errorf("[runners.docker] lost: %s", b)
	}
	c2, _, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if !c2.Runners[0].TokenExpiresAt.Equal(c.Runners[0].TokenExpiresAt) || c2.Runners[0].Token != "glrt-new" {
		t.Errorf("reloaded %+v", c2.Runners[0])
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Errorf("temporary files left: %v", ents)
	}
}

func TestSaveNewFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "sub", "config.toml")
	c := &Config{Concurrent: 2, Runners: []*Runner{{Name: "n", URL: "http://h", Token: "glrt-x", Executor: "shell", ID: 7}}}
	if err := Save(p, c); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(p)
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("new file mode %v", fi.Mode().Perm())
	}
	c2, warns, err := Load(p)
	if err != nil || len(warns) != 0 {
		t.Fatalf("%v %v", err, warns)
	}
	if c2.Runners[0].ID != 7 || c2.Concurrent != 2 || !c2.Runners[0].TokenExpiresAt.IsZero() {
		t.Fatalf("%+v", c2.Runners[0])
	}
}

func TestTokenRotationAt(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	r := &Runner{TokenObtainedAt: t0, TokenExpiresAt: t0.Add(100 * time.Hour)}
	at, ok := r.TokenRotationAt()
	if !ok || !at.Equal(t0.Add(75*time.Hour)) {
		t.Fatalf("rotation at %v %v", at, ok)
	}
	if _, ok := (&Runner{TokenObtainedAt: t0}).TokenRotationAt(); ok {
		t.Fatal("token without expiry scheduled for rotation")
	}
}

func TestSystemID(t *testing.T) {
	// HMAC-SHA256(key "abc", "gitlab-runner"), first 12 hex digits.
	if id := NewSystemID("abc"); id != NewSystemID("abc") || !regexp.MustCompile(`^s_[0-9a-f]{12}$`).MatchString(id) {
		t.Fatalf("machine system id %q", id)
	}
	if id := NewSystemID(""); !regexp.MustCompile(`^r_[0-9A-Za-z]{12}$`).MatchString(id) {
		t.Fatalf("random system id %q", id)
	}
	p := filepath.Join(t.TempDir(), "config.toml")
	id, err := LoadOrCreateSystemID(p)
	if err != nil || !ValidSystemID(id) {
		t.Fatalf("%q %v", id, err)
	}
	b, _ := os.ReadFile(filepath.Join(filepath.Dir(p), ".runner_system_id"))
	if string(b) != id {
		t.Fatalf("file holds %q, want %q", b, id)
	}
	again, _ := LoadOrCreateSystemID(p)
	if again != id {
		t.Fatal("system id not stable")
	}
}

func TestExecutorSections(t *testing.T) {
	doc := `[[runners]]
  url = "http://x"
  token = "t"
  executor = "docker"
  [runners.docker]
    image = "busybox"
    pull_policy = ["if-not-present", "never"]
    helper_image = "registry/helper:x"
    wait_for_services_timeout = -1
    tmpfs = { "/tmp" = "rw,size=64m" }
[[runners]]
  url = "http://x"
  token = "u"
  executor = "ssh"
  [runners.ssh]
    host = "10.0.0.1"
    port = "2222"
[[runners]]
  url = "http://x"
  token = "v"
  executor = "custom"
  [runners.custom]
    run_exec = "/bin/run"
    prepare_exec_timeout = 5
`
	c, warns, err := Parse("cfg.toml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	d := c.Runners[0].Docker
	if d.Image != "busybox" || strings.Join(d.PullPolicy, ",") != "if-not-present,never" || d.ServicesTimeout() != 0 || d.Tmpfs["/tmp"] != "rw,size=64m" {
		t.Errorf("docker %+v", d)
	}
	if len(warns) != 1 || warns[0].Key != "runners[0].docker.helper_image" || warns[0].Line != 8 {
		t.Errorf("warnings %v, want one for helper_image on line 8", warns)
	}
	if s := c.Runners[1].SSH; s.Host != "10.0.0.1" || s.Port != "2222" {
		t.Errorf("ssh %+v", s)
	}
	if cu := c.Runners[2].Custom; cu.RunExec != "/bin/run" || cu.PrepareExecTimeout == nil || *cu.PrepareExecTimeout != 5 || cu.CleanupExecTimeout != nil {
		t.Errorf("custom %+v", cu)
	}

	for _, tc := range []struct{ doc, want string }{
		{"[[runners]]\n url = \"http://x\"\n token = \"t\"\n executor = \"docker\"\n [runners.docker]\n  pull_policy = \"sometimes\"\n", "cfg.toml:6: runners[0].docker.pull_policy[0]"},
		{"[[runners]]\n url = \"http://x\"\n token = \"t\"\n executor = \"docker\"\n [runners.docker]\n  pull_policy = 3\n", "pull_policy"},
		{"[[runners]]\n url = \"http://x\"\n token = \"t\"\n executor = \"ssh\"\n", "runners[0].ssh.host: is required"},
		{"[[runners]]\n url = \"http://x\"\n token = \"t\"\n executor = \"ssh\"\n [runners.ssh]\n  host = \"h\"\n  port = \"22x\"\n", "cfg.toml:7: runners[0].ssh.port"},
		{"[[runners]]\n url = \"http://x\"\n token = \"t\"\n executor = \"custom\"\n [runners.custom]\n  prepare_exec = \"p\"\n", "runners[0].custom.run_exec: is required"},
	} {
		if _, _, err := Parse("cfg.toml", []byte(tc.doc)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want %q", tc.doc, err, tc.want)
		}
	}
}

func TestPluginSection(t *testing.T) {
	doc := `[[runners]]
  url = "http://x"
  token = "t"
  executor = "plugin"
  [runners.plugin]
    name = "python"
    start_timeout = 5
    [runners.plugin.config]
      kill_grace = 2
      helper = "/usr/local/bin/berth"
      nested = { a = [1, 2] }
`
	c, warns, err := Parse("cfg.toml", []byte(doc))
	if err != nil || len(warns) != 0 {
		t.Fatalf("%v %v", err, warns)
	}
	p := c.Runners[0].Plugin
	if p.Name != "python" || p.StartTimeout != 5 || p.Config["helper"] != "/usr/local/bin/berth" || p.Config["nested"] == nil {
		t.Fatalf("plugin %+v", p)
	}
	for _, tc := range []struct{ doc, want string }{
		{"[[runners]]\n url = \"http://x\"\n token = \"t\"\n executor = \"plugin\"\n", "runners[0].plugin: name or path is required"},
		{"[[runners]]\n url = \"http://x\"\n token = \"t\"\n executor = \"plugin\"\n [runners.plugin]\n  name = \"a\"\n  path = \"/b\"\n", "set name or path, not both"},
		{"[[runners]]\n url = \"http://x\"\n token = \"t\"\n executor = \"plugin\"\n [runners.plugin]\n  name = \"../x\"\n", "cfg.toml:6: runners[0].plugin.name"},
		{"[[runners]]\n url = \"http://x\"\n token = \"t\"\n executor = \"plugin\"\n [runners.plugin]\n  path = \"/p\"\n  start_timeout = -1\n", "runners[0].plugin.start_timeout"},
		{"[[runners]]\n url = \"http://x\"\n token = \"t\"\n executor = \"plugin\"\n [runners.plugin]\n  path = \"/p\"\n  args = \"x\"\n", "args"},
	} {
		if _, _, err := Parse("cfg.toml", []byte(tc.doc)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want %q", tc.doc, err, tc.want)
		}
	}
	// An unknown key of [runners.plugin] is named with its executor.
	_, warns, err = Parse("cfg.toml", []byte("[[runners]]\n url = \"http://x\"\n token = \"t\"\n executor = \"plugin\"\n [runners.plugin]\n  path = \"/p\"\n  tiemout = 3\n"))
	if err != nil || len(warns) != 1 || warns[0].Key != "runners.plugin.tiemout" || !strings.Contains(warns[0].Msg, "plugin executor") {
		t.Fatalf("%v %+v", err, warns)
	}
}

func TestMicroVMSection(t *testing.T) {
	doc := `[[runners]]
  url = "http://x"
  token = "t"
  executor = "microvm"
  [runners.microvm]
    image = "debian:12"
    allowed_images = ["debian:*", "registry.example.com/ci/*"]
    [runners.microvm.nesting_config]
      machine = "q35"
      cpus = 2
      memory_mb = 2048
[[runners]]
  url = "http://x"
  token = "u"
  executor = "instance"
  [runners.autoscaler]
    plugin = "local"
    [runners.autoscaler.vm_isolation]
      enabled = true
      nesting_host = "unix:///run/berth/nesting.sock"
      image = "debian:12"
      [runners.autoscaler.vm_isolation.nesting_config]
        memory_mb = 512
      [runners.autoscaler.vm_isolation.connector_config]
        username = "gitlab-runner"
`
	c, warns, err := Parse("cfg.toml", []byte(doc))
	if err != nil || len(warns) != 0 {
		t.Fatalf("%v %v", err, warns)
	}
	m := c.Runners[0].MicroVM
	if m.Image != "debian:12" || len(m.AllowedImages) != 2 || m.NestingConfig["machine"] != "q35" || m.NestingConfig["cpus"] != int64(2) {
		t.Fatalf("microvm %+v", m)
	}
	vi, err := econfig.ParseVMIsolation(c.Runners[1].Autoscaler.VMIsolation)
	if err != nil || !vi.Enabled || vi.NestingHost != "unix:///run/berth/nesting.sock" || vi.NestingConfig["memory_mb"] != int64(512) || vi.Image != "debian:12" {
		t.Fatalf("vm_isolation %+v %v", vi, err)
	}
	base := "[[runners]]\n url = \"http://x\"\n token = \"t\"\n"
	for _, tc := range []struct{ doc, want string }{
		{base + " executor = \"microvm\"\n [runners.microvm]\n  allowed_images = [\"a[\"]\n", `runners[0].microvm.allowed_images[0]: "a["`},
		{base + " executor = \"instance\"\n [runners.autoscaler]\n  plugin = \"p\"\n  [runners.autoscaler.vm_isolation]\n   enabled = true\n", "runners[0].autoscaler.vm_isolation.nesting_host: is required"},
		{base + " executor = \"docker-autoscaler\"\n [runners.autoscaler]\n  plugin = \"p\"\n  [runners.autoscaler.vm_isolation]\n   enabled = true\n   nesting_host = \"/s\"\n", "runners[0].autoscaler.vm_isolation.enabled: VMs per slot are for the instance executor, not docker-autoscaler"},
		{base + " executor = \"instance\"\n [runners.autoscaler]\n  plugin = \"p\"\n  [runners.autoscaler.vm_isolation]\n   enabled = true\n   nesting_hots = \"/s\"\n", "runners[0].autoscaler.vm_isolation.nesting_hots: unknown key"},
		{base + " executor = \"instance\"\n [runners.autoscaler]\n  plugin = \"p\"\n  [runners.autoscaler.vm_isolation]\n   enabled = \"yes\"\n", "runners[0].autoscaler.vm_isolation"},
	} {
		if _, _, err := Parse("cfg.toml", []byte(tc.doc)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want %q", tc.doc, err, tc.want)
		}
	}
	// An unknown key of [runners.microvm] is named with its executor.
	_, warns, err = Parse("cfg.toml", []byte(base+" executor = \"microvm\"\n [runners.microvm]\n  imgae = \"x\"\n"))
	if err != nil || len(warns) != 1 || warns[0].Key != "runners.microvm.imgae" || !strings.Contains(warns[0].Msg, "microvm executor") {
		t.Fatalf("%v %+v", err, warns)
	}
	// Saving keeps the sections.
	p := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(p, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	c, _, err = Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := Save(p, c); err != nil {
		t.Fatal(err)
	}
	c2, _, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if c2.Runners[0].MicroVM == nil || c2.Runners[0].MicroVM.NestingConfig["memory_mb"] != int64(2048) {
		t.Errorf("after save: %+v", c2.Runners[0].MicroVM)
	}
}

// tls-ca-file, tls-cert-file and tls-key-file are read, not warned about,
// and relative ones are beside config.toml.
func TestLoadTLSFiles(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config.toml")
	data := "[[runners]]\n  name = \"a\"\n  url = \"https://gitlab.example.com\"\n  token = \"glrt-x\"\n  executor = \"shell\"\n" +
		"  tls-ca-file = \"certs/ca.pem\"\n  tls-cert-file = \"/etc/ssl/client.pem\"\n  tls-key-file = \"client.key\"\n"
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	c, warns, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(warns) != 0 {
		t.Errorf("warnings %v", warns)
	}
	f := c.Runners[0].TLSFiles()
	if f.CAFile != filepath.Join(dir, "certs/ca.pem") || f.CertFile != "/etc/ssl/client.pem" || f.KeyFile != filepath.Join(dir, "client.key") {
		t.Errorf("TLS files %+v", f)
	}
	// Saving keeps the paths as written.
	if err := Save(path, c); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	if !strings.Contains(string(b), `tls-ca-file = "certs/ca.pem"`) || !strings.Contains(string(b), `tls-key-file = "client.key"`) {
		t.Errorf("saved:\n%s", b)
	}
}

// The certificate directory is certs/ beside config.toml: its host files
// fill what the entry does not set, and saving writes none of them.
func TestLoadCertsDir(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config.toml")
	data := "[[runners]]\n  name = \"a\"\n  url = \"https://gitlab.example.com:8443/\"\n  token = \"glrt-x\"\n  executor = \"shell\"\n"
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	certs := filepath.Join(dir, "certs")
	if err := os.Mkdir(certs, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"gitlab.example.com.crt", "gitlab.example.com.auth.crt", "gitlab.example.com.auth.key"} {
		if err := os.WriteFile(filepath.Join(certs, name), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	c, _, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	f := c.Runners[0].TLSFiles()
	if f.CAFile != filepath.Join(certs, "gitlab.example.com.crt") || f.KeyFile != filepath.Join(certs, "gitlab.example.com.auth.key") {
		t.Errorf("TLS files %+v", f)
	}
	if err := Save(path, c); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); strings.Contains(string(b), "tls-") || strings.Contains(string(b), "certs") {
		t.Errorf("saved:\n%s", b)
	}
}

// [runners.custom_build_dir] enabled is read (no warning); unset, it is
// GitLab's default of the executor.
func TestCustomBuildDirEnabled(t *testing.T) {
	data := "[[runners]]\n  name = \"a\"\n  url = \"https://gitlab.example.com\"\n  token = \"glrt-x\"\n  executor = \"shell\"\n" +
		"  [runners.custom_build_dir]\n    enabled = true\n" +
		"[[runners]]\n  name = \"b\"\n  url = \"https://gitlab.example.com\"\n  token = \"glrt-y\"\n  executor = \"docker\"\n" +
		"  [runners.custom_build_dir]\n    enabled = false\n"
	c, warns, err := Parse("config.toml", []byte(data))
	if err != nil {
		t.Fatal(err)
	}
	if len(warns) != 0 {
		t.Errorf("warnings %v", warns)
	}
	if !c.Runners[0].CustomBuildDirEnabled() || c.Runners[1].CustomBuildDirEnabled() {
		t.Errorf("explicit settings not taken: %v %v", c.Runners[0].CustomBuildDirEnabled(), c.Runners[1].CustomBuildDirEnabled())
	}
	for executor, want := range map[string]bool{"shell": false, "ssh": false, "custom": false, "instance": false, "plugin": false,
		"docker": true, "docker-autoscaler": true, "microvm": true} {
		if got := (&Runner{Executor: executor}).CustomBuildDirEnabled(); got != want {
			t.Errorf("%s: default %v, want %v", executor, got, want)
		}
	}
}

// clone_url is read; one without a scheme is named in a warning, as
// gitlab-runner ignores it.
func TestCloneURLKey(t *testing.T) {
	entry := func(clone string) string {
		return "[[runners]]\n  name = \"a\"\n  url = \"https://gitlab.example.com\"\n  token = \"glrt-x\"\n  executor = \"shell\"\n  clone_url = \"" + clone + "\"\n"
	}
	c, warns, err := Parse("config.toml", []byte(entry("http://10.0.0.5:8080")))
	if err != nil || len(warns) != 0 || !c.Runners[0].UsesCloneURL() {
		t.Fatalf("a clone_url with a scheme: %v %v", warns, err)
	}
	c, warns, err = Parse("config.toml", []byte(entry("10.0.0.5")))
	if err != nil || len(warns) != 1 || warns[0].Key != "runners[0].clone_url" || warns[0].Line != 6 || c.Runners[0].UsesCloneURL() {
		t.Fatalf("a clone_url without a scheme: %v %v", warns, err)
	}
}

// TestDockerContainerKeys: gitlab-runner's [runners.docker] container
// keys decode, in GitLab's TOML types, without a warning; the ones Berth
// leaves out still warn.
func TestDockerContainerKeys(t *testing.T) {
	doc := `[[runners]]
  url = "http://x"
  token = "t"
  executor = "docker"
  [runners.docker]
    image = "busybox"
    hostname = "ci-host"
    runtime = "runc"
    cpu_shares = 512
    cpuset_cpus = "0,1"
    cpuset_mems = "0"
    memory_reservation = "64m"
    oom_kill_disable = true
    oom_score_adjust = 100
    group_add = ["docker"]
    userns_mode = "host"
    pid_mode = "host"
    ipcmode = "shareable"
    device_cgroup_rules = ["c 1:3 mr"]
    links = ["mysql_container:mysql"]
    mac_address = "92:d0:c6:0a:29:33"
    volumes_from = ["storage_container:ro"]
    volume_driver = "local"
    network_mtu = 1400
    enable_ipv6 = true
    volume_keep = true
    services_privileged = false
    services_security_opt = ["no-new-privileges"]
    service_cpus = "0.5"
    service_cpu_shares = 256
    service_cpuset_cpus = "1"
    service_memory = "256m"
    service_memory_swap = "512m"
    service_memory_reservation = "128m"
    allowed_privileged_images = ["docker:*"]
    allowed_privileged_services = ["docker:*-dind"]
    allowed_users = ["1000", "nobody"]
    disable_entrypoint_overwrite = true
    gpus = "all"
    isolation = "process"
    [runners.docker.sysctls]
      "net.ipv4.ip_forward" = "1"
    [runners.docker.ulimit]
      "nofile" = "1024:2048"
    [runners.docker.log_options]
      env = "CI_JOB_ID"
    [runners.docker.volume_driver_ops]
      "size" = "50gb"
    [runners.docker.services_devices]
      "postgres:*" = ["/dev/null"]
`
	c, warns, err := Parse("cfg.toml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, w := range warns {
		got[w.Key] = true
	}
	if len(warns) != 2 || !got["runners.docker.gpus"] || !got["runners.docker.isolation"] {
		t.Errorf("warnings %v, want only gpus and isolation", warns)
	}
	d := c.Runners[0].Docker
	if d.Hostname != "ci-host" || d.CPUShares != 512 || d.OomScoreAdjust != 100 || !d.OomKillDisable || d.IpcMode != "shareable" ||
		d.NetworkMTU != 1400 || !d.EnableIPv6 || !d.VolumeKeep || d.ServicesPrivileged == nil || *d.ServicesPrivileged || d.ServiceCPUShares != 256 ||
		d.Sysctls["net.ipv4.ip_forward"] != "1" || d.Ulimit["nofile"] != "1024:2048" || d.LogOptions["env"] != "CI_JOB_ID" ||
		d.VolumeDriverOps["size"] != "50gb" || len(d.ServicesDevices["postgres:*"]) != 1 || len(d.AllowedUsers) != 2 || !d.DisableEntrypointOverwrite {
		t.Errorf("docker %+v", d)
	}
}

// safe_directory_checkout is read (no warning); unset it is nil, and the
// runner decides by the environment.
func TestSafeDirectoryCheckoutKey(t *testing.T) {
	c, warns, err := Parse("config.toml", []byte("[[runners]]\n  name = \"a\"\n  url = \"https://gitlab.example.com\"\n  token = \"glrt-x\"\n  executor = \"shell\"\n  safe_directory_checkout = true\n"))
	if err != nil || len(warns) != 0 || c.Runners[0].SafeDirectoryCheckout == nil || !*c.Runners[0].SafeDirectoryCheckout {
		t.Fatalf("%+v %v %v", c.Runners[0].SafeDirectoryCheckout, warns, err)
	}
}

// labels: the global ones under each entry's own, validated as GitLab
// validates them.
func TestLabels(t *testing.T) {
	c, warns, err := Parse("config.toml", []byte(`[labels]
  team = "ci"
  region = "eu-west-1"
[[runners]]
  name = "a"
  url = "http://127.0.0.1:8080"
  token = "glrt-x"
  executor = "shell"
  [runners.labels]
    region = "us-east-1"
    gpu = "a100"
[[runners]]
  name = "b"
  url = "http://127.0.0.1:8080"
  token = "glrt-y"
  executor = "shell"
`))
	if err != nil || len(warns) != 0 {
		t.Fatalf("%v %v", err, warns)
	}
	if got := c.Runners[0].ComputedLabels(); !maps.Equal(got, map[string]string{"team": "ci", "region": "us-east-1", "gpu": "a100"}) {
		t.Errorf("first entry's labels %v", got)
	}
	if got := c.Runners[1].ComputedLabels(); !maps.Equal(got, map[string]string{"team": "ci", "region": "eu-west-1"}) {
		t.Errorf("second entry's labels %v", got)
	}
	many := "[[runners]]\n  name = \"a\"\n  url = \"http://127.0.0.1:8080\"\n  token = \"glrt-x\"\n  executor = \"shell\"\n  [runners.labels]\n"
	for i := range 33 {
		many += fmt.Sprintf("    key%02d = \"v\"\n", i)
	}
	for _, c := range []struct{ doc, want string }{
		{"[labels]\n  \"a b\" = \"x\"\n", `labels: label name "a b" does not match`},
		{"[labels]\n  ab = \"x\"\n", `label name "ab" does not match`}, // too short
		{"[labels]\n  team = \"two words\"\n", `labels.team: label value "two words" does not match`},
		{many, "runners[0].labels: 33 labels with the global ones, at most 32"},
	} {
		if _, _, err := Parse("config.toml", []byte(c.doc)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want %q", c.doc, err, c.want)
		}
	}
}
