package plugin_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	goplugin "github.com/hashicorp/go-plugin"

	"github.com/berthci/berth/executor"
	econfig "github.com/berthci/berth/executor/config"
	"github.com/berthci/berth/executor/plugin"
	"github.com/berthci/berth/executor/plugin/internal/pb"
	"github.com/berthci/berth/executor/plugin/internal/wire"
	"github.com/berthci/berth/executor/plugin/sdk"
	"github.com/berthci/berth/executor/shell"
	"github.com/berthci/berth/runner/helper"
)

// roleEnv makes the test binary play a plugin (see TestMain).
const roleEnv = "BERTH_TEST_PLUGIN_ROLE"

// The test binary plays the plugins of these tests, chosen by roleEnv:
//
//	shell    the shell executor served through the SDK
//	v99      a plugin that speaks only executor protocol version 99
//	silent   a program that never completes the handshake
//	hang     a plugin whose Create never answers
//
// Run as "<test binary> helper …" it is the berth helper of the jobs of the
// pipeline tests.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "helper" {
		os.Exit(helper.Main(context.Background(), os.Args[2:], os.Stdout, os.Stderr, "test"))
	}
	switch os.Getenv(roleEnv) {
	case "shell":
		os.Exit(sdk.Main(sdk.Options{Name: "test-shell", Version: "v0.0.1", New: newTestShell}, nil, os.Stdout, os.Stderr))
	case "v99":
		goplugin.Serve(&goplugin.ServeConfig{
			HandshakeConfig:  wire.Handshake,
			VersionedPlugins: map[int]goplugin.PluginSet{99: {wire.PluginName: &wire.GRPCPlugin{Impl: &pb.UnimplementedExecutorServer{}}}},
			GRPCServer:       wire.NewGRPCServer,
		})
		os.Exit(0)
	case "silent":
		fmt.Fprintln(os.Stderr, "not a plugin, just sleeping")
		time.Sleep(time.Hour)
		os.Exit(0)
	case "hang":
		os.Exit(sdk.Main(sdk.Options{Name: "test-hang", New: func(context.Context, sdk.Setup) (executor.Provider, error) {
			return hangProvider{}, nil
		}}, nil, os.Stdout, os.Stderr))
	}
	code := m.Run()
	for _, c := range cleanups {
		c()
	}
	os.Exit(code)
}

// cleanups run after every test of the binary.
var cleanups []func()

// testShellConfig is the configuration the "shell" role takes.
type testShellConfig struct {
	BuildsDir string `json:"builds_dir"`
	CacheDir  string `json:"cache_dir"`
	KillGrace string `json:"kill_grace"`
}

func newTestShell(_ context.Context, s sdk.Setup) (executor.Provider, error) {
	var c testShellConfig
	if err := sdk.DecodeConfig(s.Config, &c); err != nil {
		return nil, err
	}
	grace, err := time.ParseDuration(c.KillGrace)
	if c.KillGrace != "" && err != nil {
		return nil, fmt.Errorf("kill_grace: %w", err)
	}
	return shell.New(shell.Config{DefaultBuildsDir: c.BuildsDir, DefaultCacheDir: c.CacheDir, KillGrace: grace, Helper: "/bin/true", Logger: s.Logger}), nil
}

type hangProvider struct{}

func (hangProvider) Create(ctx context.Context) (executor.Executor, error) {
	<-ctx.Done()
	time.Sleep(time.Hour)
	return nil, ctx.Err()
}

// opts returns Options that start this test binary as the plugin role.
func opts(t *testing.T, role string, cfg map[string]any) plugin.Options {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return plugin.Options{
		Config:         econfig.Plugin{Path: exe, Config: cfg, StartTimeout: 20},
		Env:            []string{roleEnv + "=" + role},
		RestartBackoff: 50 * time.Millisecond,
	}
}

func shellConfig(dir string) map[string]any {
	return map[string]any{"builds_dir": filepath.Join(dir, "builds"), "cache_dir": filepath.Join(dir, "cache"), "kill_grace": "200ms"}
}

func start(t *testing.T, o plugin.Options) *plugin.Provider {
	t.Helper()
	p, err := plugin.New(t.Context(), o)
	if err != nil {
		t.Fatalf("plugin.New: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := p.Shutdown(ctx); err != nil && !errors.Is(err, plugin.ErrPluginExited) {
			t.Errorf("Shutdown: %v", err)
		}
	})
	return p
}

// alive reports whether process pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return false
	}
	return s[i+2] != 'Z'
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
