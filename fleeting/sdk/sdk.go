// Package sdk is what a fleeting plugin's main calls. A plugin is a value
// implementing fleeting.InstanceGroup whose configuration fields carry json
// tags; main is one line:
//
//	func main() { sdk.Serve(&myplugin.Group{}, sdk.Options{Name: "fleeting-plugin-my", Version: version}) }
//
// Run without arguments (the way GitLab Runner and Berth start plugins) the
// binary serves the plugin over hashicorp/go-plugin and gRPC, wire-compatible
// with GitLab's fleeting. "version" prints the version; Options.Commands adds
// more subcommands.
//
// The SDK depends only on the fleeting contract, the transport and their
// libraries (go-plugin, gRPC, protobuf); a test keeps it that way, so a
// plugin author does not pull in Berth's coordinator or runner.
package sdk

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"sort"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"

	"github.com/berthci/berth/fleeting"
	"github.com/berthci/berth/fleeting/internal/transport"
	"github.com/berthci/berth/internal/pluginproc"
)

// Options describe the plugin binary.
type Options struct {
	// Name is the binary's name, e.g. "fleeting-plugin-aws".
	Name string
	// Version is the plugin's version, e.g. "v1.2.3"; it answers the
	// version subcommand and fills ProviderInfo.Version when the plugin
	// leaves it empty. Empty means "dev".
	Version string
	// Commands are extra subcommands, keyed by name. A command gets the
	// arguments after its name; an error makes the process exit with 1.
	Commands map[string]func(ctx context.Context, args []string) error
	// ParentCheckInterval is how often a serving plugin checks that the
	// process that started it still exists; when it is gone the plugin
	// shuts down and exits, so a crashed host leaves no plugin behind.
	// 0 means one second; negative disables the check.
	ParentCheckInterval time.Duration
}

// Serve runs the plugin process: it dispatches the command line and exits
// the process with the result. It never returns.
func Serve(impl fleeting.InstanceGroup, opts Options) {
	os.Exit(run(impl, opts, os.Args[1:], os.Stdout, os.Stderr))
}

// Main is Serve for a program whose own command line leads to the plugin
// (berth fleeting-plugin local): args are the plugin's arguments (none
// means serve), and it returns the exit status instead of exiting.
func Main(impl fleeting.InstanceGroup, opts Options, args []string, stdout, stderr io.Writer) int {
	return run(impl, opts, args, stdout, stderr)
}

func run(impl fleeting.InstanceGroup, opts Options, args []string, stdout, stderr io.Writer) int {
	if opts.Version == "" {
		opts.Version = "dev"
	}
	if opts.Name == "" {
		opts.Name = "fleeting-plugin"
	}
	cmd := "serve"
	if len(args) > 0 {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "serve":
		if os.Getenv(transport.MagicCookieKey) != transport.MagicCookieValue {
			fmt.Fprintf(stderr, "%s is a fleeting plugin: it is started by GitLab Runner or Berth, not by hand.\n", opts.Name)
			fmt.Fprintf(stderr, "Try: %s version\n", opts.Name)
			return 1
		}
		serve(impl, opts, stderr)
		return 0
	case "version", "--version", "-v":
		fmt.Fprintf(stdout, "%s %s (%s)\n", opts.Name, opts.Version, BuildInfo())
		return 0
	case "help", "--help", "-h":
		usage(stdout, opts)
		return 0
	}
	if c, ok := opts.Commands[cmd]; ok {
		if err := c(context.Background(), args); err != nil {
			fmt.Fprintf(stderr, "%s %s: %v\n", opts.Name, cmd, err)
			return 1
		}
		return 0
	}
	fmt.Fprintf(stderr, "%s: unknown command %q\n", opts.Name, cmd)
	usage(stderr, opts)
	return 2
}

func usage(w io.Writer, opts Options) {
	fmt.Fprintf(w, "usage: %s [serve | version", opts.Name)
	names := make([]string, 0, len(opts.Commands))
	for n := range opts.Commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, " | %s", n)
	}
	fmt.Fprintln(w, "]")
}

// serve serves the plugin over go-plugin until the host tells it to stop
// (or goes away).
func serve(impl fleeting.InstanceGroup, opts Options, stderr io.Writer) {
	// go-plugin swaps os.Stderr for a pipe streamed to the host as raw
	// output; structured logs must go to the real stderr, captured here,
	// where the host parses them line by line.
	logger := slog.New(NewLogHandler(stderr, slog.LevelDebug))
	internal := hclog.New(&hclog.LoggerOptions{
		Name:       "go-plugin",
		Level:      hclog.Info,
		Output:     stderr,
		JSONFormat: true,
	})
	if opts.ParentCheckInterval >= 0 {
		interval := opts.ParentCheckInterval
		if interval == 0 {
			interval = time.Second
		}
		go pluginproc.WatchParent(interval, func() {
			logger.Warn("the host process is gone; shutting down")
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := impl.Shutdown(ctx); err != nil && !errors.Is(err, fleeting.ErrNotInitialized) {
				logger.Error("shutdown after host exit", "error", err)
			}
			os.Exit(0)
		})
	}
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: transport.Handshake,
		VersionedPlugins: transport.PluginSet(&transport.Server{
			Impl:      impl,
			Logger:    logger,
			Version:   opts.Version,
			BuildInfo: BuildInfo(),
		}),
		GRPCServer: transport.NewGRPCServer,
		Logger:     internal,
	})
}

// DecodeConfig decodes a plugin_config JSON document into a plugin the way
// Serve does before Init: into target's json-tagged fields, rejecting
// unknown keys, or by target's own DecodeConfig([]byte) error method if it
// has one. Empty input decodes as "{}". Useful for in-process use and tests.
func DecodeConfig(data []byte, target any) error { return transport.DecodeConfig(data, target) }

// BuildInfo describes the running binary: Go version, platform and, when
// recorded, the VCS revision.
func BuildInfo() string {
	parts := []string{runtime.Version(), runtime.GOOS + "/" + runtime.GOARCH}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && s.Value != "" {
				parts = append(parts, "rev "+s.Value)
			}
		}
	}
	return strings.Join(parts, " ")
}
