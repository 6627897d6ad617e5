package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/berthci/berth/fleeting"
	"github.com/berthci/berth/fleeting/connector"
	"github.com/berthci/berth/fleeting/host"
)

// newFleetingCmd is `berth fleeting`: operator tools for instance-group
// plugins.
func newFleetingCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "fleeting",
		Short: "Inspect fleeting instance-group plugins and their instances",
		Long: `Operator tools for fleeting plugins (GitLab's and Berth's alike).

The configuration file (--config) is either a GitLab Runner config.toml, whose
[runners.autoscaler] table is used (--runner picks the [[runners]] entry by
name), or a file with plugin, [plugin_config] and [connector_config] at the top
level (TOML, or JSON when it ends in .json).`,
	}
	cmd.AddCommand(newFleetingListCmd(), newFleetingInstancesCmd(), newFleetingExecCmd(),
		newFleetingIncreaseCmd(), newFleetingDecreaseCmd())
	return cmd
}

func newFleetingListCmd() *cobra.Command {
	var installDir string
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the plugins found in PATH and installed in the plugin directory",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			found, err := host.List(installDir)
			if err != nil {
				return fmt.Errorf("fleeting list: %w", err)
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "NAME\tVERSION\tSOURCE\tPATH")
			for _, f := range found {
				v := f.Version
				if v == "" {
					v = pluginVersion(cmd.Context(), f.Path)
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", f.Name, v, f.Source, f.Path)
			}
			w.Flush()
			if len(found) == 0 {
				dir := installDir
				if dir == "" {
					dir = host.InstallDir()
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "no plugins in PATH (fleeting-plugin-*) or under %s\n", dir)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&installDir, "plugin-dir", "", "installed plugin directory (default $FLEETING_PLUGIN_PATH or ~/.config/fleeting/plugins)")
	return cmd
}

// pluginVersion asks a plugin binary for its version (the `version`
// subcommand every fleeting plugin has); "?" if it does not answer.
func pluginVersion(ctx context.Context, path string) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "version").Output()
	if err != nil {
		return "?"
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	if fields := strings.Fields(line); len(fields) >= 2 && strings.HasPrefix(fields[0], host.BinaryPrefix) {
		return fields[1]
	}
	return line
}

// fleetingFlags are the flags shared by instances and exec.
type fleetingFlags struct {
	plugin     string
	config     string
	runner     string
	logLevel   string
	installDir string
	timeout    time.Duration
}

func (f *fleetingFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.plugin, "plugin", "", "plugin reference: a path, a fleeting-plugin-* name in PATH, or an installed [registry/][namespace/]name[:version] (default: the plugin named in --config)")
	cmd.Flags().StringVar(&f.config, "config", "", "configuration file with plugin_config and connector_config (see berth fleeting --help)")
	cmd.Flags().StringVar(&f.runner, "runner", "", "the [[runners]] entry to use from a config.toml (default: the first with an autoscaler)")
	cmd.Flags().StringVar(&f.logLevel, "log-level", "warn", "level of the plugin's relayed logs: debug, info, warn, error")
	cmd.Flags().StringVar(&f.installDir, "plugin-dir", "", "installed plugin directory")
	cmd.Flags().DurationVar(&f.timeout, "timeout", 2*time.Minute, "bound on starting the plugin, Init and Update")
}

// start loads the configuration, starts the plugin and initialises it.
func (f *fleetingFlags) start(ctx context.Context, stderr io.Writer) (*host.Plugin, host.FileConfig, error) {
	fc := host.FileConfig{PluginConfig: []byte("{}")}
	if f.config != "" {
		data, err := os.ReadFile(f.config)
		if err != nil {
			return nil, fc, err
		}
		fc, err = host.ParseFile(filepath.Base(f.config), filepath.Dir(f.config), data, f.runner)
		if err != nil {
			return nil, fc, err
		}
	}
	ref := f.plugin
	if ref == "" {
		ref = fc.Plugin
	}
	if ref == "" {
		return nil, fc, errors.New("no plugin: give --plugin or a --config that names one")
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		return nil, fc, fmt.Errorf("--log-level: %w", err)
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	p, err := host.Start(ctx, host.Config{
		Plugin:       ref,
		Builtin:      builtinFleetingPlugin,
		InstallDir:   f.installDir,
		PluginConfig: fc.PluginConfig,
		Logger:       logger,
		StartTimeout: f.timeout,
	})
	if err != nil {
		return nil, fc, err
	}
	if _, err := p.Init(ctx, logger, fc.Settings); err != nil {
		p.Close()
		return nil, fc, err
	}
	return p, fc, nil
}

func newFleetingInstancesCmd() *cobra.Command {
	var f fleetingFlags
	var addresses bool
	cmd := &cobra.Command{
		Use:   "instances",
		Short: "Start a plugin, initialise it and list its instances with their states",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), f.timeout)
			defer cancel()
			p, _, err := f.start(ctx, cmd.ErrOrStderr())
			if err != nil {
				return fmt.Errorf("fleeting instances: %w", err)
			}
			defer p.Shutdown(context.WithoutCancel(ctx))
			type row struct {
				id    string
				state fleeting.State
			}
			var rows []row
			if err := p.Update(ctx, func(id string, s fleeting.State) { rows = append(rows, row{id, s}) }); err != nil {
				return fmt.Errorf("fleeting instances: %w", err)
			}
			sort.Slice(rows, func(i, j int) bool { return rows[i].id < rows[j].id })
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			if addresses {
				fmt.Fprintln(w, "ID\tSTATE\tINTERNAL\tEXTERNAL")
			} else {
				fmt.Fprintln(w, "ID\tSTATE")
			}
			for _, r := range rows {
				if !addresses {
					fmt.Fprintf(w, "%s\t%s\n", r.id, r.state)
					continue
				}
				in, ex := "-", "-"
				if info, err := p.ConnectInfo(ctx, r.id); err == nil {
					in, ex = orDash(info.InternalAddr), orDash(info.ExternalAddr)
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", r.id, r.state, in, ex)
			}
			return w.Flush()
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVar(&addresses, "addresses", false, "also show each instance's addresses (one ConnectInfo per instance)")
	return cmd
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func newFleetingExecCmd() *cobra.Command {
	var f fleetingFlags
	var external bool
	cmd := &cobra.Command{
		Use:   "exec [flags] INSTANCE -- COMMAND...",
		Short: "Run a command on an instance through the SSH connector",
		Long: `Run a command on an instance through the SSH connector, with this
terminal's stdin, stdout and stderr; berth exits with the command's exit status.`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, command := args[0], strings.Join(args[1:], " ")
			setup, cancel := context.WithTimeout(cmd.Context(), f.timeout)
			defer cancel()
			p, fc, err := f.start(setup, cmd.ErrOrStderr())
			if err != nil {
				return fmt.Errorf("fleeting exec: %w", err)
			}
			defer p.Shutdown(context.WithoutCancel(setup))
			info, err := p.ConnectInfo(setup, id)
			if err != nil {
				return fmt.Errorf("fleeting exec: %w", err)
			}
			c, err := connector.Dial(setup, info, connector.Options{UseExternalAddr: external || fc.UseExternalAddr})
			if err != nil {
				return fmt.Errorf("fleeting exec: %w", err)
			}
			defer c.Close()
			err = c.Run(cmd.Context(), connector.Command{
				Cmd:    command,
				Stdin:  cmd.InOrStdin(),
				Stdout: cmd.OutOrStdout(),
				Stderr: cmd.ErrOrStderr(),
			})
			var ee *connector.ExitError
			if errors.As(err, &ee) {
				code := ee.Code
				if code < 0 {
					code = 255
				}
				return &exitError{code: code, err: fmt.Errorf("fleeting exec on %s: %w", id, err)}
			}
			if err != nil {
				return fmt.Errorf("fleeting exec: %w", err)
			}
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVar(&external, "external", false, "connect to the instance's external address (as use_external_addr)")
	return cmd
}

func newFleetingIncreaseCmd() *cobra.Command {
	var f fleetingFlags
	cmd := &cobra.Command{
		Use:   "increase N",
		Short: "Ask the plugin for N new instances (as the autoscaler would)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			n, err := strconv.Atoi(args[0])
			if err != nil || n < 0 {
				return fmt.Errorf("fleeting increase: %q is not a count", args[0])
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), f.timeout)
			defer cancel()
			p, _, err := f.start(ctx, cmd.ErrOrStderr())
			if err != nil {
				return fmt.Errorf("fleeting increase: %w", err)
			}
			defer p.Shutdown(context.WithoutCancel(ctx))
			got, err := p.Increase(ctx, n)
			if err != nil {
				return fmt.Errorf("fleeting increase: %w", err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%d of %d requested\n", got, n)
			return nil
		},
	}
	f.register(cmd)
	return cmd
}

func newFleetingDecreaseCmd() *cobra.Command {
	var f fleetingFlags
	cmd := &cobra.Command{
		Use:   "decrease INSTANCE...",
		Short: "Ask the plugin to delete instances",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), f.timeout)
			defer cancel()
			p, _, err := f.start(ctx, cmd.ErrOrStderr())
			if err != nil {
				return fmt.Errorf("fleeting decrease: %w", err)
			}
			defer p.Shutdown(context.WithoutCancel(ctx))
			ids, err := p.Decrease(ctx, args)
			if err != nil {
				return fmt.Errorf("fleeting decrease: %w", err)
			}
			for _, id := range ids {
				fmt.Fprintln(cmd.OutOrStdout(), id)
			}
			if len(ids) < len(args) {
				return &exitError{code: 1, err: fmt.Errorf("fleeting decrease: %d of %d deletions accepted", len(ids), len(args))}
			}
			return nil
		},
	}
	f.register(cmd)
	return cmd
}
