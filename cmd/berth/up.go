package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/berthci/berth/coordinator/client"
	"github.com/berthci/berth/coordinator/embedded"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/executor/dockerautoscaler"
	"github.com/berthci/berth/executor/instance"
	"github.com/berthci/berth/runner"
	"github.com/berthci/berth/runner/config"
	"github.com/berthci/berth/taskscaler"
	"github.com/berthci/berth/token"
)

// upOptions are berth up's settings.
type upOptions struct {
	data, listen, executor, idleTime string
	maxInstances, capacity, idle     int
	asJSON                           bool
	logLevel                         string
}

// upSummary is what berth up prints once it runs (--json: as JSON).
type upSummary struct {
	URL          string `json:"url"`
	Data         string `json:"data_dir"`
	AdminToken   string `json:"admin_token_file"`
	Config       string `json:"runner_config"`
	Runner       string `json:"runner"`
	Executor     string `json:"executor"`
	Plugin       string `json:"fleeting_plugin"`
	MaxInstances int    `json:"max_instances"`
	Capacity     int    `json:"capacity_per_instance"`
	IdleCount    int    `json:"idle_count"`
	IdleTime     string `json:"idle_time"`
}

func newUpCmd() *cobra.Command {
	var o upOptions
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Coordinator, runner manager and autoscaler for one machine, in one command",
		Long: `Start everything a team needs on one machine: the coordinator, a runner manager
and its autoscaler, whose instances come from the local fleeting plugin (SSH servers of
Berth's own on this machine, each job in a slot of one). It prints the URL, where the
admin token is and what it started, and runs until SIGINT or SIGTERM, which stop the
jobs, delete the instances and stop the coordinator.

Everything lives in the data directory: the coordinator's database and artifacts, the
admin token, the runner's config.toml (written on first start, reused after) and the
instances' state. Scaling out later is a change of that config.toml — another fleeting
plugin in [runners.autoscaler] (aws, gcp, …) — not a different product.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			gc, err := startGCTuner()
			if err != nil {
				return err
			}
			defer gc.Stop()
			return runUp(cmd.Context(), o, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.data, "data", defaultDataDir(), "data directory")
	f.StringVar(&o.listen, "listen", "", "address of the coordinator (default 127.0.0.1:8080; with docker-autoscaler the Docker bridge's address, which containers reach)")
	f.StringVar(&o.executor, "executor", instance.Name, "executor of the runner on first start: instance (jobs over SSH on the instances) or docker-autoscaler (jobs in containers)")
	f.IntVar(&o.maxInstances, "max-instances", 4, "most instances at once (first start)")
	f.IntVar(&o.capacity, "capacity", max(1, runtime.NumCPU()/2), "jobs per instance (first start)")
	f.IntVar(&o.idle, "idle-count", 0, "idle job slots kept ready (first start)")
	f.StringVar(&o.idleTime, "idle-time", "5m", "how long an idle instance stays (first start)")
	f.BoolVar(&o.asJSON, "json", false, "print the summary as JSON")
	f.StringVar(&o.logLevel, "log-level", "warn", "log level of the components: debug, info, warn, error")
	return cmd
}

func runUp(ctx context.Context, o upOptions, stdout, stderr io.Writer) error {
	switch o.executor {
	case instance.Name, dockerautoscaler.Name:
	default:
		return &exitError{code: 2, err: fmt.Errorf("--executor %q: want instance or docker-autoscaler", o.executor)}
	}
	if _, err := time.ParseDuration(o.idleTime); err != nil {
		return &exitError{code: 2, err: fmt.Errorf("--idle-time %q: %w", o.idleTime, err)}
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return &exitError{code: 2, err: fmt.Errorf("--log-level %q: %w", o.logLevel, err)}
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	data, err := filepath.Abs(o.data)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(data, 0o700); err != nil {
		return err
	}
	cfgPath := filepath.Join(data, "config.toml")
	cfg, existing, err := loadUpConfig(cfgPath, stderr)
	if err != nil {
		return err
	}
	executorName := o.executor
	if existing != nil {
		executorName = existing.Executor
	}
	listen := o.listen
	if listen == "" {
		listen = "127.0.0.1:8080"
		if executorName == dockerautoscaler.Name {
			ip, err := dockerBridgeIP()
			if err != nil {
				return fmt.Errorf("docker-autoscaler: containers reach the coordinator on the Docker bridge: %w (give --listen)", err)
			}
			listen = net.JoinHostPort(ip, "8080")
		}
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", listen, err)
	}
	coord, err := embedded.Open(ctx, embedded.Options{DataDir: filepath.Join(data, "coordinator"), Listener: ln,
		Logger: log.With("component", "coordinator")})
	if err != nil {
		return err
	}
	defer coord.Shutdown(context.Background())
	tokenFile := filepath.Join(data, adminTokenFile)
	adminTok := os.Getenv("BERTH_ADMIN_TOKEN")
	if b, err := os.ReadFile(tokenFile); err == nil && adminTok == "" {
		adminTok = strings.TrimSpace(string(b))
	}
	minted, err := coord.EnsureAdminToken(ctx, adminTok)
	if err != nil {
		return fmt.Errorf("setting up the admin token: %w", err)
	}
	if minted != "" {
		if err := os.WriteFile(tokenFile, []byte(minted+"\n"), 0o600); err != nil {
			return fmt.Errorf("saving the admin token: %w", err)
		}
		adminTok = minted
	}

	// The runner: the one config.toml names, if the coordinator knows
	// its token; else a new one.
	if existing != nil {
		if _, err := coord.Store.RunnerByTokenDigest(ctx, token.Digest(existing.Token)); err != nil {
			fmt.Fprintf(stderr, "the runner of %s is unknown to this coordinator: registering a new one\n", cfgPath)
			existing = nil
			cfg.Runners = nil
		}
	}
	if existing == nil {
		created, err := client.New(coord.URL, adminTok).CreateRunner(ctx, restapi.CreateRunnerRequest{
			RunnerType: "instance_type", Description: "berth up", RunUntagged: ptrTo(true)})
		if err != nil {
			return fmt.Errorf("creating the runner: %w", err)
		}
		existing = upRunner(o, coord.URL, created.Token, data)
		cfg.Runners = []*config.Runner{existing}
		cfg.Concurrent = o.maxInstances * o.capacity
		if err := config.Save(cfgPath, cfg); err != nil {
			return err
		}
		// Loaded again, so that paths resolve as for berth runner run.
		if cfg, _, err = config.Load(cfgPath); err != nil {
			return err
		}
		existing = cfg.Runners[0]
	} else if existing.URL != coord.URL {
		existing.URL = coord.URL
		if err := config.Save(cfgPath, cfg); err != nil {
			return err
		}
	}
	m, err := runner.New(cfg, runner.Options{Logger: log.With("component", "runner"), NewProvider: newProvider(ctx, log),
		ConfigPath: cfgPath, Version: version})
	if err != nil {
		return err
	}
	a := existing.Autoscaler
	s := upSummary{URL: coord.URL, Data: data, AdminToken: tokenFile, Config: cfgPath, Runner: token.Short(existing.Token),
		Executor: existing.Executor, Plugin: a.Plugin, MaxInstances: a.MaxInstances, Capacity: max(1, a.CapacityPerInstance)}
	if len(a.Policies) > 0 {
		s.IdleCount, s.IdleTime = a.Policies[0].IdleCount, a.Policies[0].IdleTime.String()
	}
	printUp(stdout, s, o.asJSON)

	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- m.Run(runCtx) }()
	select {
	case <-ctx.Done():
		fmt.Fprintln(stderr, "stopping: aborting jobs, deleting instances")
		cancel()
		err = <-done
	case err = <-done:
	}
	cctx, ccancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer ccancel()
	if cerr := m.Close(cctx); cerr != nil {
		log.Warn("stopping the autoscaler", "err", cerr)
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// loadUpConfig loads the runner config of a previous berth up; existing
// is its runner, nil on first start.
func loadUpConfig(path string, stderr io.Writer) (*config.Config, *config.Runner, error) {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return &config.Config{Concurrent: 1}, nil, nil
	}
	cfg, warns, err := config.Load(path)
	if err != nil {
		return nil, nil, err
	}
	for _, w := range warns {
		fmt.Fprintln(stderr, "warning:", w)
	}
	for _, r := range cfg.Runners {
		if r.Executor == instance.Name || r.Executor == dockerautoscaler.Name {
			return cfg, r, nil
		}
	}
	return nil, nil, fmt.Errorf("%s has no instance or docker-autoscaler runner: remove it to start afresh", path)
}

// upRunner is the [[runners]] entry berth up writes on first start.
func upRunner(o upOptions, url, tok, data string) *config.Runner {
	host, _ := os.Hostname()
	idle, _ := time.ParseDuration(o.idleTime)
	return &config.Runner{
		Name: "berth-up-" + host, URL: url, Token: tok, Executor: o.executor,
		Autoscaler: &taskscaler.Config{
			Plugin: "local",
			PluginConfig: map[string]any{
				"name": "up", "state_dir": filepath.Join(data, "fleeting-local"), "max_instances": o.maxInstances,
			},
			CapacityPerInstance: o.capacity, MaxInstances: o.maxInstances,
			DeleteInstancesOnShutdown: true,
			StateStorage:              taskscaler.StateStorage{Enabled: true},
			Policies:                  []taskscaler.Policy{{IdleCount: o.idle, IdleTime: idle}},
		},
	}
}

func printUp(w io.Writer, s upSummary, asJSON bool) {
	if asJSON {
		_ = json.NewEncoder(w).Encode(s)
		return
	}
	fmt.Fprintf(w, "Berth is up.\n")
	fmt.Fprintf(w, "  coordinator  %s   (data in %s)\n", s.URL, s.Data)
	fmt.Fprintf(w, "  admin token  %s   (export BERTH_ADMIN_TOKEN=$(cat %s))\n", s.AdminToken, s.AdminToken)
	fmt.Fprintf(w, "  web UI       %s/   (sign in with the admin token; berth users create for others)\n", s.URL)
	fmt.Fprintf(w, "  runner       %s, %s executor, config %s\n", s.Runner, s.Executor, s.Config)
	fmt.Fprintf(w, "  autoscaler   %s plugin: 0 to %d instances on this machine, %d jobs each, %d idle slots kept, idle instances removed after %s\n",
		s.Plugin, s.MaxInstances, s.Capacity, s.IdleCount, s.IdleTime)
	fmt.Fprintf(w, "Run a pipeline:  berth pipelines create --server %s --project NAME DIR\n", s.URL)
	fmt.Fprintf(w, "Scale out later: another fleeting plugin in [runners.autoscaler] of %s, then berth up again.\n", s.Config)
}

// dockerBridgeIP is this host's address on Docker's default bridge.
func dockerBridgeIP() (string, error) {
	ifc, err := net.InterfaceByName("docker0")
	if err != nil {
		return "", err
	}
	addrs, err := ifc.Addrs()
	if err != nil {
		return "", err
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil {
			return ipn.IP.String(), nil
		}
	}
	return "", errors.New("docker0 has no IPv4 address")
}

func ptrTo[T any](v T) *T { return &v }
