package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/executor/custom"
	"github.com/berthci/berth/executor/docker"
	"github.com/berthci/berth/executor/dockerautoscaler"
	"github.com/berthci/berth/executor/instance"
	"github.com/berthci/berth/executor/microvm"
	"github.com/berthci/berth/executor/plugin"
	"github.com/berthci/berth/executor/shell"
	"github.com/berthci/berth/executor/ssh"
	"github.com/berthci/berth/runner"
	"github.com/berthci/berth/runner/config"
	"github.com/berthci/berth/runner/network"
	"github.com/berthci/berth/runnerapi"
	"github.com/berthci/berth/taskscaler"
	"github.com/berthci/berth/token"
)

// defaultRunnerConfig is /etc/berth/config.toml for root, else
// ~/.berth/config.toml (gitlab-runner: /etc/gitlab-runner, ~/.gitlab-runner).
func defaultRunnerConfig() string {
	if p := os.Getenv("BERTH_RUNNER_CONFIG"); p != "" {
		return p
	}
	if os.Geteuid() == 0 {
		return "/etc/berth/config.toml"
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".berth", "config.toml")
	}
	return "config.toml"
}

// newProvider is the explicit list of executors this binary wires. ctx
// bounds the start of a provider (a plugin's handshake, the Docker engine's
// ping), not its life: a runner manager told to stop while it starts does
// not wait for a slow plugin first.
func newProvider(ctx context.Context, log *slog.Logger) func(rc *config.Runner) (executor.Provider, error) {
	return func(rc *config.Runner) (executor.Provider, error) {
		switch rc.Executor {
		case shell.Name:
			return shell.New(shell.Config{Logger: log, Env: nil}), nil
		case docker.Name:
			var c config.Docker
			if rc.Docker != nil {
				c = *rc.Docker
			}
			return docker.New(ctx, docker.Options{Config: c, Logger: log.With("runner", rc.Name)})
		case ssh.Name:
			var c config.SSH
			if rc.SSH != nil {
				c = *rc.SSH
			}
			return ssh.New(ssh.Options{Config: c, Logger: log.With("runner", rc.Name)})
		case custom.Name:
			var c config.Custom
			if rc.Custom != nil {
				c = *rc.Custom
			}
			return custom.New(custom.Options{Config: c, BuildsDir: rc.BuildsDir, CacheDir: rc.CacheDir, Logger: log.With("runner", rc.Name)})
		case instance.Name, dockerautoscaler.Name:
			return newAutoscaledProvider(ctx, rc, log)
		case microvm.Name:
			var c config.MicroVM
			if rc.MicroVM != nil {
				c = *rc.MicroVM
			}
			return newMicroVMProvider(c, token.Short(rc.Token), log.With("runner", rc.Name))
		case plugin.Name:
			var c config.Plugin
			if rc.Plugin != nil {
				c = *rc.Plugin
			}
			return plugin.New(ctx, plugin.Options{Config: c, RunnerName: rc.Name, HostVersion: version,
				Builtin: builtinPlugin, Logger: log.With("runner", rc.Name)})
		}
		return nil, fmt.Errorf("executor %q is not available in this build", rc.Executor)
	}
}

func runnerLogger(stderr io.Writer, format, level string) *slog.Logger {
	log, _ := runnerLoggerVar(stderr, format, level)
	return log
}

// runnerLoggerVar is runnerLogger with its level in a LevelVar, which a
// reload of config.toml sets.
func runnerLoggerVar(stderr io.Writer, format, level string) (*slog.Logger, *slog.LevelVar) {
	lv := new(slog.LevelVar)
	lv.Set(logLevel(level))
	opts := &slog.HandlerOptions{Level: lv}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(stderr, opts)), lv
	}
	return slog.New(slog.NewTextHandler(stderr, opts)), lv
}

// logLevel reads log_level (gitlab-runner's names).
func logLevel(level string) slog.Level {
	switch strings.ToLower(level) {
	case "debug":
		return slog.LevelDebug
	case "warn", "warning":
		return slog.LevelWarn
	case "error", "fatal", "panic":
		return slog.LevelError
	}
	return slog.LevelInfo
}

func newRunnerCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "runner",
		Short: "Runner manager: register runners in config.toml and run jobs (gitlab-runner compatible)",
	}
	cmd.AddCommand(newRunnerRegisterCmd(), newRunnerVerifyCmd(), newRunnerUnregisterCmd(),
		newRunnerRunCmd(), newRunnerRunSingleCmd(), newRunnerListCmd())
	return cmd
}

// loadOrEmpty loads path, or returns an empty config when it does not
// exist yet (register creates it).
func loadOrEmpty(path string, stderr io.Writer) (*config.Config, error) {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return &config.Config{Concurrent: config.DefaultConcurrent, CheckInterval: 0}, nil
	}
	cfg, warns, err := config.Load(path)
	for _, w := range warns {
		fmt.Fprintln(stderr, "WARNING:", w.String())
	}
	return cfg, err
}

func newRunnerRegisterCmd() *cobra.Command {
	var (
		cfgPath, url, tok, name, executorName, description, tags, accessLevel, buildsDir, cacheDir, shellName string
		sections                                                                                              executorFlags
		runUntagged, locked, paused                                                                           bool
		maxTimeout, limit                                                                                     int
		env                                                                                                   []string
		tlsFiles                                                                                              network.TLSFiles
	)
	cmd := &cobra.Command{
		Use:   "register",
		Short: "Register a runner with a coordinator and add it to config.toml",
		Long: `Register a runner. A glrt- authentication token (a runner created in the UI, the API or with
"berth runners create") is verified (POST /runners/verify); anything else is a legacy registration
token (POST /runners). The runner entry is appended to config.toml, written atomically.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if url == "" || tok == "" {
				return errors.New("--url and --token are required")
			}
			if !config.Supported(executorName) {
				return fmt.Errorf("executor %q is not supported by Berth yet (supported: %s)", executorName, strings.Join(config.SupportedExecutors, ", "))
			}
			cfg, err := loadOrEmpty(cfgPath, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			systemID, err := config.LoadOrCreateSystemID(cfgPath)
			if err != nil {
				return err
			}
			info := &runnerapi.Info{Name: "berth", Version: version, Executor: executorName, Shell: shellName}
			runner.SetClientFeatures(&info.Features)
			c := network.New(network.Options{Version: version})
			// The certificate directory beside config.toml serves
			// registration too, as gitlab-runner's does; only the flags
			// are written into the entry.
			if err := c.SetTLS(url, tlsFiles.WithCertsDir(filepath.Join(filepath.Dir(cfgPath), config.CertsDirName), url)); err != nil {
				return err
			}
			ctx := cmd.Context()
			var resp *runnerapi.RunnerTokenResponse
			if strings.HasPrefix(tok, token.PrefixRunnerAuth) {
				changed := false
				for _, f := range []string{"tag-list", "locked", "paused", "run-untagged", "access-level", "maximum-timeout", "description"} {
					changed = changed || cmd.Flags().Changed(f)
				}
				if changed {
					return errors.New("runner settings (--description, --tag-list, --locked, --paused, --run-untagged, --access-level, --maximum-timeout) belong to the server for glrt- tokens")
				}
				resp, err = c.Verify(ctx, network.RunnerCredentials{URL: url, Token: tok}, systemID, info)
				if err != nil {
					return fmt.Errorf("verifying runner: %w", err)
				}
				if resp.ID == 0 {
					return errors.New("verifying runner: the coordinator did not return a runner id")
				}
				if resp.Token == "" {
					resp.Token = tok
				}
			} else {
				req := runnerapi.RegisterRequest{Token: tok, Description: description, TagList: runnerapi.SplitTags(tags),
					AccessLevel: accessLevel, MaximumTimeout: maxTimeout, Info: info}
				if cmd.Flags().Changed("run-untagged") {
					req.RunUntagged = &runUntagged
				}
				if cmd.Flags().Changed("locked") {
					req.Locked = &locked
				}
				if cmd.Flags().Changed("paused") {
					req.Paused = &paused
				}
				resp, err = c.Register(ctx, url, req)
				if err != nil {
					return fmt.Errorf("registering runner: %w", err)
				}
			}
			expires, err := runner.ParseExpiry(resp.TokenExpiresAt)
			if err != nil {
				return err
			}
			if name == "" {
				name, _ = os.Hostname()
			}
			rc := &config.Runner{
				Name: name, URL: url, ID: resp.ID, Token: resp.Token,
				TokenObtainedAt: time.Now().UTC().Truncate(time.Second), TokenExpiresAt: expires,
				Executor: executorName, BuildsDir: buildsDir, CacheDir: cacheDir, Shell: shellName, Limit: limit, Environment: env,
				TLSCAFile: tlsFiles.CAFile, TLSCertFile: tlsFiles.CertFile, TLSKeyFile: tlsFiles.KeyFile,
			}
			sections.apply(rc)
			cfg.Runners = append(cfg.Runners, rc)
			if err := cfg.Validate(); err != nil {
				return err
			}
			if err := config.Save(cfgPath, cfg); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Runner registered successfully (id %d, token %s…). Config saved in %s\n", resp.ID, token.Short(resp.Token), cfgPath)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVarP(&cfgPath, "config", "c", defaultRunnerConfig(), "config file")
	f.StringVarP(&url, "url", "u", "", "coordinator URL")
	f.StringVarP(&tok, "token", "t", "", "runner authentication token (glrt-…) or registration token")
	f.StringVar(&name, "name", "", "runner name (default: host name)")
	f.StringVar(&executorName, "executor", "shell", "executor")
	f.StringVar(&description, "description", "", "description (registration tokens only)")
	f.StringVar(&tags, "tag-list", "", "comma-separated tags (registration tokens only)")
	f.BoolVar(&runUntagged, "run-untagged", false, "run untagged jobs (registration tokens only)")
	f.BoolVar(&locked, "locked", true, "lock to the project (registration tokens only)")
	f.BoolVar(&paused, "paused", false, "register paused (registration tokens only)")
	f.StringVar(&accessLevel, "access-level", "", "not_protected or ref_protected (registration tokens only)")
	f.IntVar(&maxTimeout, "maximum-timeout", 0, "maximum job timeout in seconds (registration tokens only)")
	f.StringVar(&buildsDir, "builds-dir", "", "builds_dir")
	f.StringVar(&cacheDir, "cache-dir", "", "cache_dir")
	f.StringVar(&shellName, "shell", "", "shell: bash or sh")
	tlsFlags(f, &tlsFiles)
	sections.register(f)
	f.IntVar(&limit, "limit", 0, "maximum concurrent jobs of this runner (0: unlimited)")
	f.StringArrayVar(&env, "env", nil, "KEY=VALUE added to every job (repeatable)")
	return cmd
}

func newRunnerVerifyCmd() *cobra.Command {
	var (
		cfgPath string
		del     bool
	)
	cmd := &cobra.Command{
		Use:   "verify",
		Short: "Check every runner's token with the coordinator (--delete removes invalid ones from config.toml)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadConfig(cmd, cfgPath)
			if err != nil {
				return err
			}
			systemID, err := config.LoadOrCreateSystemID(cfgPath)
			if err != nil {
				return err
			}
			c := network.New(network.Options{Version: version})
			var keep []*config.Runner
			invalid := 0
			for _, rc := range cfg.Runners {
				info := &runnerapi.Info{Name: "berth", Version: version, Executor: rc.Executor}
				runner.SetClientFeatures(&info.Features)
				_, err := c.Verify(cmd.Context(), network.RunnerCredentials{URL: rc.URL, Token: rc.Token}, systemID, info)
				switch {
				case err == nil:
					fmt.Fprintf(cmd.OutOrStdout(), "Verifying runner... is valid  runner=%s name=%s\n", token.Short(rc.Token), rc.Name)
					keep = append(keep, rc)
				case errors.Is(err, network.ErrForbidden) || errors.Is(err, network.ErrOrphaned):
					invalid++
					fmt.Fprintf(cmd.OutOrStdout(), "Verifying runner... is removed  runner=%s name=%s (%v)\n", token.Short(rc.Token), rc.Name, err)
				default:
					return fmt.Errorf("verifying runner %s: %w", token.Short(rc.Token), err)
				}
			}
			if del && invalid > 0 {
				cfg.Runners = keep
				if err := config.Save(cfgPath, cfg); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "Updated %s\n", cfgPath)
			} else if invalid > 0 {
				return &exitError{code: 1, err: fmt.Errorf("%d runner(s) invalid; --delete removes them", invalid)}
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&cfgPath, "config", "c", defaultRunnerConfig(), "config file")
	cmd.Flags().BoolVar(&del, "delete", false, "remove invalid runners from config.toml")
	return cmd
}

func newRunnerUnregisterCmd() *cobra.Command {
	var (
		cfgPath, name, url, tok string
		all                     bool
	)
	cmd := &cobra.Command{
		Use:   "unregister",
		Short: "Unregister runners and remove them from config.toml",
		Long: `Unregister runners. For a glrt- runner (created in the UI or API) only this machine's runner
manager is deleted (DELETE /runners/managers); a runner registered with a registration token is
deleted (DELETE /runners). Select with --name, --url and --token, or --all-runners.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadConfig(cmd, cfgPath)
			if err != nil {
				return err
			}
			if !all && name == "" && tok == "" {
				return errors.New("select runners with --name, --token (and --url) or --all-runners")
			}
			systemID, err := config.LoadOrCreateSystemID(cfgPath)
			if err != nil {
				return err
			}
			c := network.New(network.Options{Version: version})
			var keep []*config.Runner
			n := 0
			for _, rc := range cfg.Runners {
				match := all || (name != "" && rc.Name == name) || (tok != "" && rc.Token == tok && (url == "" || rc.URL == url))
				if !match {
					keep = append(keep, rc)
					continue
				}
				creds := network.RunnerCredentials{URL: rc.URL, Token: rc.Token}
				if strings.HasPrefix(rc.Token, token.PrefixRunnerAuth) {
					err = c.UnregisterManager(cmd.Context(), creds, systemID)
				} else {
					err = c.Unregister(cmd.Context(), creds)
				}
				if err != nil && !errors.Is(err, network.ErrForbidden) && !errors.Is(err, network.ErrNotFound) {
					return fmt.Errorf("unregistering runner %s: %w", token.Short(rc.Token), err)
				}
				n++
				fmt.Fprintf(cmd.OutOrStdout(), "Unregistering runner... succeeded  runner=%s name=%s\n", token.Short(rc.Token), rc.Name)
			}
			if n == 0 {
				return errors.New("no runner in config.toml matches")
			}
			cfg.Runners = keep
			return config.Save(cfgPath, cfg)
		},
	}
	f := cmd.Flags()
	f.StringVarP(&cfgPath, "config", "c", defaultRunnerConfig(), "config file")
	f.StringVarP(&name, "name", "n", "", "runner name")
	f.StringVarP(&url, "url", "u", "", "coordinator URL")
	f.StringVarP(&tok, "token", "t", "", "runner token")
	f.BoolVar(&all, "all-runners", false, "unregister every runner of config.toml")
	return cmd
}

func newRunnerListCmd() *cobra.Command {
	var cfgPath string
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the runners of config.toml",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadConfig(cmd, cfgPath)
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tEXECUTOR\tURL\tTOKEN\tEXPIRES")
			for _, rc := range cfg.Runners {
				exp := "never"
				if !rc.TokenExpiresAt.IsZero() {
					exp = rc.TokenExpiresAt.Format(time.RFC3339)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", rc.Name, rc.Executor, rc.URL, token.Short(rc.Token), exp)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVarP(&cfgPath, "config", "c", defaultRunnerConfig(), "config file")
	return cmd
}

// notifyQuit listens for SIGQUIT from before the manager exists: starting
// one can take a while (a fleeting plugin's handshake, an executor's
// setup), and a SIGQUIT meanwhile must mean "finish and exit" as it does
// later, not the Go runtime's goroutine dump and exit that leaves the
// instances and VMs of the previous manager behind.
func notifyQuit() (<-chan os.Signal, func()) {
	quit := make(chan os.Signal, 1)
	signal.Notify(quit, syscall.SIGQUIT)
	return quit, func() { signal.Stop(quit) }
}

// runManager runs m until ctx ends (abort) or a signal on quit (finish
// jobs); a signal that came while m was starting stops it at once.
func runManager(ctx context.Context, m *runner.Manager, log *slog.Logger, quit <-chan os.Signal) error {
	go func() {
		select {
		case <-quit:
			log.Info("SIGQUIT: finishing running jobs, then exiting")
			m.Stop()
		case <-ctx.Done():
		}
	}()
	err := m.Run(ctx)
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if cerr := m.Close(cctx); cerr != nil {
		log.Warn("releasing executors", "err", cerr)
	}
	return err
}

func newRunnerRunCmd() *cobra.Command {
	var cfgPath, listen, user, workDir, service string
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the runner manager: ask for jobs and run them (config.toml reloaded on change and SIGHUP; SIGQUIT: finish jobs and exit; SIGTERM/SIGINT: abort them)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if workDir != "" {
				// Relative builds_dir and cache_dir are below it, as
				// gitlab-runner's; the configuration file stays where it
				// was named.
				abs, err := filepath.Abs(cfgPath)
				if err != nil {
					return err
				}
				cfgPath = abs
				if err := os.Chdir(workDir); err != nil {
					return fmt.Errorf("--working-directory: %w", err)
				}
			}
			loaded, _ := os.ReadFile(cfgPath) // before Load: a change after it is seen
			cfg, warns, err := config.Load(cfgPath)
			if err != nil {
				return err
			}
			if listen != "" {
				cfg.ListenAddress = listen
			}
			log, level := runnerLoggerVar(cmd.ErrOrStderr(), cfg.LogFormat, cfg.LogLevel)
			for _, w := range warns {
				log.Warn("config key ignored", "file", w.File, "line", w.Line, "key", w.Key, "reason", w.Msg)
			}
			if len(cfg.Runners) == 0 {
				return fmt.Errorf("%s has no [[runners]]: run berth runner register first", cfgPath)
			}
			quit, stopQuit := notifyQuit()
			defer stopQuit()
			m, err := runner.New(cfg, runner.Options{Logger: log, NewProvider: newProvider(cmd.Context(), log), ConfigPath: cfgPath, Version: version,
				HTTPClient: http.DefaultClient, User: user})
			if err != nil {
				return err
			}
			ctx, stopWatch := context.WithCancel(cmd.Context())
			defer stopWatch()
			go watchConfig(ctx, m, configWatch{path: cfgPath, listen: listen, level: level, every: configCheckInterval, loaded: loaded}, log)
			return runManager(ctx, m, log, quit)
		},
	}
	cmd.Flags().StringVarP(&cfgPath, "config", "c", defaultRunnerConfig(), "config file")
	cmd.Flags().StringVar(&listen, "listen-address", "", "metrics address (overrides listen_address)")
	cmd.Flags().StringVarP(&user, "user", "u", "", "run the shell executor's jobs as this user (the runner running as root; overrides config.toml's user)")
	cmd.Flags().StringVarP(&workDir, "working-directory", "d", "", "change to this directory first (relative builds_dir and cache_dir are below it)")
	// gitlab-runner's service units pass --service NAME; it only names the
	// service, so their flags carry over to berth runner run as they are.
	cmd.Flags().StringVar(&service, "service", "", "the service's name (accepted for gitlab-runner's service units; unused)")
	return cmd
}

func newRunnerRunSingleCmd() *cobra.Command {
	var (
		rc          config.Runner
		maxBuilds   int
		logLevel    string
		logFormat   string
		poll        time.Duration
		concurrency int
	)
	cmd := &cobra.Command{
		Use:   "run-single",
		Short: "Run one runner from flags, without config.toml (--max-builds N: exit after N jobs)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := runnerLogger(cmd.ErrOrStderr(), logFormat, logLevel)
			if rc.Name == "" {
				rc.Name, _ = os.Hostname()
			}
			// The default configuration's certificate directory, as
			// gitlab-runner run-single reads its own.
			rc.CertsDir = filepath.Join(filepath.Dir(defaultRunnerConfig()), config.CertsDirName)
			cfg := &config.Config{Concurrent: max(concurrency, 1), Runners: []*config.Runner{&rc}}
			if err := cfg.Validate(); err != nil {
				return err
			}
			quit, stopQuit := notifyQuit()
			defer stopQuit()
			m, err := runner.New(cfg, runner.Options{Logger: log, NewProvider: newProvider(cmd.Context(), log), Version: version,
				MaxJobs: maxBuilds, PollInterval: poll, HTTPClient: http.DefaultClient})
			if err != nil {
				return err
			}
			return runManager(cmd.Context(), m, log, quit)
		},
	}
	f := cmd.Flags()
	f.StringVarP(&rc.URL, "url", "u", "", "coordinator URL")
	f.StringVarP(&rc.Token, "token", "t", "", "runner authentication token")
	f.StringVar(&rc.Name, "name", "", "runner name")
	f.StringVar(&rc.Executor, "executor", "shell", "executor")
	f.StringVar(&rc.BuildsDir, "builds-dir", "", "builds_dir")
	f.StringVar(&rc.CacheDir, "cache-dir", "", "cache_dir")
	f.StringVar(&rc.Shell, "shell", "", "shell: bash or sh")
	f.StringVar(&rc.TLSCAFile, "tls-ca-file", "", "PEM certificate authorities trusted for --url beside the system's")
	f.StringVar(&rc.TLSCertFile, "tls-cert-file", "", "PEM client certificate for --url")
	f.StringVar(&rc.TLSKeyFile, "tls-key-file", "", "PEM key of --tls-cert-file")
	f.IntVar(&rc.OutputLimit, "output-limit", 0, "maximum job log size in KiB")
	f.StringArrayVar(&rc.Environment, "env", nil, "KEY=VALUE added to every job (repeatable)")
	f.IntVar(&maxBuilds, "max-builds", 0, "exit after this many jobs (0: never)")
	f.IntVar(&concurrency, "concurrent", 1, "jobs at once")
	f.DurationVar(&poll, "check-interval", 0, "poll interval (default 3s)")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&logFormat, "log-format", "text", "text or json")
	return cmd
}

// loadConfig loads config.toml and prints its warnings (keys Berth does
// not support) on stderr.
func loadConfig(cmd *cobra.Command, path string) (*config.Config, error) {
	cfg, warns, err := config.Load(path)
	if err != nil {
		return nil, err
	}
	for _, w := range warns {
		fmt.Fprintln(cmd.ErrOrStderr(), "WARNING:", w.String())
	}
	return cfg, nil
}

// executorFlags are gitlab-runner register's flags for the executors'
// sections, under the same names.
type executorFlags struct {
	dockerImage, dockerPullPolicy, dockerNetworkMode                   string
	dockerPrivileged                                                   bool
	dockerVolumes                                                      []string
	sshHost, sshPort, sshUser, sshPassword, sshIdentity, sshKnownHosts string
	sshNoStrict                                                        bool
	customConfig, customPrepare, customRun, customCleanup              string
	// Berth's: [runners.autoscaler] and [runners.plugin] basics.
	autoscalerPlugin       string
	maxInstances, capacity int
	pluginName, pluginPath string
}

func (x *executorFlags) register(f *pflag.FlagSet) {
	f.StringVar(&x.dockerImage, "docker-image", "", "docker: default image ([runners.docker] image)")
	f.BoolVar(&x.dockerPrivileged, "docker-privileged", false, "docker: privileged containers")
	f.StringArrayVar(&x.dockerVolumes, "docker-volumes", nil, "docker: a volume, /path or host:container[:mode] (repeatable)")
	f.StringVar(&x.dockerPullPolicy, "docker-pull-policy", "", "docker: always, if-not-present or never")
	f.StringVar(&x.dockerNetworkMode, "docker-network-mode", "", "docker: network_mode")
	f.StringVar(&x.sshHost, "ssh-host", "", "ssh: host")
	f.StringVar(&x.sshPort, "ssh-port", "", "ssh: port (default 22)")
	f.StringVar(&x.sshUser, "ssh-user", "", "ssh: user")
	f.StringVar(&x.sshPassword, "ssh-password", "", "ssh: password")
	f.StringVar(&x.sshIdentity, "ssh-identity-file", "", "ssh: private key file")
	f.StringVar(&x.sshKnownHosts, "ssh-known-hosts-file", "", "ssh: known_hosts file")
	f.BoolVar(&x.sshNoStrict, "ssh-disable-strict-host-key-checking", false, "ssh: accept any host key")
	f.StringVar(&x.customConfig, "custom-config-exec", "", "custom: config_exec")
	f.StringVar(&x.customPrepare, "custom-prepare-exec", "", "custom: prepare_exec")
	f.StringVar(&x.customRun, "custom-run-exec", "", "custom: run_exec")
	f.StringVar(&x.customCleanup, "custom-cleanup-exec", "", "custom: cleanup_exec")
	f.StringVar(&x.autoscalerPlugin, "autoscaler-plugin", "", "instance, docker-autoscaler: the fleeting plugin ([runners.autoscaler] plugin; local is built in)")
	f.IntVar(&x.maxInstances, "autoscaler-max-instances", 0, "instance, docker-autoscaler: max_instances")
	f.IntVar(&x.capacity, "autoscaler-capacity-per-instance", 0, "instance, docker-autoscaler: capacity_per_instance")
	f.StringVar(&x.pluginName, "plugin-name", "", "plugin: the executor plugin's name ([runners.plugin] name)")
	f.StringVar(&x.pluginPath, "plugin-path", "", "plugin: the executor plugin's program ([runners.plugin] path)")
}

// apply writes the section of rc's executor.
func (x *executorFlags) apply(rc *config.Runner) {
	switch rc.Executor {
	case docker.Name:
		d := &config.Docker{Image: x.dockerImage, Privileged: x.dockerPrivileged, Volumes: x.dockerVolumes, NetworkMode: x.dockerNetworkMode}
		if x.dockerPullPolicy != "" {
			d.PullPolicy = config.StringList{x.dockerPullPolicy}
		}
		rc.Docker = d
	case ssh.Name:
		s := &config.SSH{Host: x.sshHost, Port: x.sshPort, User: x.sshUser, Password: x.sshPassword, IdentityFile: x.sshIdentity, KnownHostsFile: x.sshKnownHosts}
		if x.sshNoStrict {
			s.DisableStrictHostKeyChecking = &x.sshNoStrict
		}
		rc.SSH = s
	case custom.Name:
		rc.Custom = &config.Custom{ConfigExec: x.customConfig, PrepareExec: x.customPrepare, RunExec: x.customRun, CleanupExec: x.customCleanup}
	case instance.Name, dockerautoscaler.Name:
		rc.Autoscaler = &taskscaler.Config{Plugin: x.autoscalerPlugin, MaxInstances: x.maxInstances, CapacityPerInstance: x.capacity}
		if rc.Executor == dockerautoscaler.Name && x.dockerImage != "" {
			rc.Docker = &config.Docker{Image: x.dockerImage}
		}
	case plugin.Name:
		rc.Plugin = &config.Plugin{Name: x.pluginName, Path: x.pluginPath}
	}
}

// tlsFlags are gitlab-runner's --tls-ca-file, --tls-cert-file and
// --tls-key-file, written to the entry as tls-ca-file, ….
func tlsFlags(f *pflag.FlagSet, files *network.TLSFiles) {
	f.StringVar(&files.CAFile, "tls-ca-file", "", "PEM certificate authorities trusted for --url beside the system's (tls-ca-file)")
	f.StringVar(&files.CertFile, "tls-cert-file", "", "PEM client certificate for --url (tls-cert-file)")
	f.StringVar(&files.KeyFile, "tls-key-file", "", "PEM key of --tls-cert-file (tls-key-file)")
}
