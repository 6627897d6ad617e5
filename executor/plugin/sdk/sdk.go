// Package sdk is what an executor plugin written in Go calls: implement
// executor.Provider (and, optionally, executor.Describer, Isolator, Sweeper
// and Shutdowner) and hand a constructor to Serve:
//
//	func main() {
//		sdk.Serve(sdk.Options{
//			Name: "berth-executor-mine", Version: version,
//			New: func(ctx context.Context, s sdk.Setup) (executor.Provider, error) {
//				var cfg myConfig
//				if err := sdk.DecodeConfig(s.Config, &cfg); err != nil {
//					return nil, err
//				}
//				return newProvider(cfg, s.Logger), nil
//			},
//		})
//	}
//
// Run without arguments by a Berth runner manager (which sets the magic
// cookie), the binary serves the provider over hashicorp/go-plugin and
// gRPC, speaking executor.proto. Optional capabilities are advertised from
// what the provider implements, never guessed. "version" prints the
// version.
//
// The plugin logs structured lines to stderr (Setup.Logger), which the
// runner manager relays into its own log. When the runner manager dies the
// plugin cleans up every executor it still holds and exits.
package sdk

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/executor/plugin/internal/wire"
	"github.com/berthci/berth/internal/pluginproc"
)

// Options describe the plugin.
type Options struct {
	// Name is the plugin's name (e.g. "berth-executor-shell"); it is also
	// the executor name reported to the coordinator unless the provider's
	// Describe sets another. Required.
	Name string
	// Version is the plugin's version; empty means "dev".
	Version string
	// New builds the provider from the runner's configuration. It is
	// called once per plugin process, on the first Describe. An error is
	// reported to the runner manager as an invalid configuration.
	New func(ctx context.Context, s Setup) (executor.Provider, error)
	// ParentCheckInterval is how often a serving plugin checks that the
	// runner manager that started it still exists (0: one second;
	// negative: never).
	ParentCheckInterval time.Duration
}

// Setup is what New gets.
type Setup struct {
	// Config is the [runners.plugin.config] table as a JSON object.
	Config json.RawMessage
	// Logger writes to the plugin's stderr in the format the runner
	// manager relays.
	Logger *slog.Logger
	// HostVersion is the runner manager's version; RunnerName the
	// [[runners]] entry's name.
	HostVersion string
	RunnerName  string
	// Helper is the runner manager's berth binary on this host, for a
	// plugin whose environments run here to use as Environment.Helper.
	Helper string
}

// ErrConfig marks an error of New as a configuration problem (every error
// of New is reported as one; wrapping it is optional).
var ErrConfig = wire.ErrConfig

// DecodeConfig decodes a configuration into target's json-tagged fields,
// refusing unknown keys so that a misspelt key is an error, not a silent
// default. An empty document decodes as {}.
func DecodeConfig(data json.RawMessage, target any) error {
	if len(data) == 0 {
		data = json.RawMessage("{}")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(target); err != nil {
		return fmt.Errorf("%w: %v", ErrConfig, err)
	}
	if dec.More() {
		return fmt.Errorf("%w: data after the configuration object", ErrConfig)
	}
	return nil
}

// Serve runs the plugin process: it dispatches the command line and exits
// the process with the result. It never returns.
func Serve(opts Options) {
	os.Exit(Main(opts, os.Args[1:], os.Stdout, os.Stderr))
}

// Main is Serve for a program whose own command line leads to the plugin
// (berth executor-plugin shell): args are the plugin's arguments (none
// means serve), and it returns the exit status instead of exiting.
func Main(opts Options, args []string, stdout, stderr io.Writer) int {
	if opts.Version == "" {
		opts.Version = "dev"
	}
	if opts.Name == "" {
		opts.Name = "berth-executor-plugin"
	}
	cmd := "serve"
	if len(args) > 0 {
		cmd = args[0]
	}
	switch cmd {
	case "serve":
		if os.Getenv(wire.MagicCookieKey) != wire.MagicCookieValue {
			fmt.Fprintf(stderr, "%s is a Berth executor plugin: a runner manager starts it (executor = \"plugin\"), not a person.\n", opts.Name)
			fmt.Fprintf(stderr, "Try: %s version\n", opts.Name)
			return 1
		}
		if opts.New == nil {
			fmt.Fprintf(stderr, "%s: sdk.Options.New is nil\n", opts.Name)
			return 1
		}
		serve(opts, stderr)
		return 0
	case "version", "--version", "-v":
		fmt.Fprintf(stdout, "%s %s (executor protocol %d)\n", opts.Name, opts.Version, wire.ProtocolVersion)
		return 0
	case "help", "--help", "-h":
		fmt.Fprintf(stdout, "usage: %s [serve | version]\n", opts.Name)
		return 0
	}
	fmt.Fprintf(stderr, "%s: unknown command %q\nusage: %s [serve | version]\n", opts.Name, cmd, opts.Name)
	return 2
}

// serve serves until the host stops the plugin or goes away.
func serve(opts Options, stderr io.Writer) {
	// go-plugin swaps os.Stderr for a pipe streamed to the host as raw
	// output; structured logs go to the real stderr, captured here.
	logger := slog.New(pluginproc.NewLogHandler(stderr, slog.LevelDebug)).With("plugin", opts.Name)
	srv := newServer(opts, logger)
	if opts.ParentCheckInterval >= 0 {
		interval := opts.ParentCheckInterval
		if interval == 0 {
			interval = time.Second
		}
		go pluginproc.WatchParent(interval, func() {
			logger.Warn("the runner manager is gone; cleaning up and exiting")
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := srv.shutdown(ctx); err != nil {
				logger.Error("cleanup after the runner manager exited", "error", err)
			}
			os.Exit(0)
		})
	}
	internal := hclog.New(&hclog.LoggerOptions{Name: "go-plugin", Level: hclog.Warn, Output: stderr, JSONFormat: true})
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig:  wire.Handshake,
		VersionedPlugins: wire.PluginSet(srv),
		GRPCServer:       wire.NewGRPCServer,
		Logger:           internal,
	})
}
