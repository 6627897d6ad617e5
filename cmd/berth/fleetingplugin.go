package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/berthci/berth/fleeting"
	"github.com/berthci/berth/fleeting/host"
	"github.com/berthci/berth/fleeting/plugins/local"
	"github.com/berthci/berth/fleeting/plugins/static"
	"github.com/berthci/berth/fleeting/sdk"
)

// builtinFleetingPlugins are the fleeting plugins "berth fleeting-plugin
// NAME" serves, so that Berth autoscales out of the box without a plugin
// binary: local (instances are SSH servers on this machine) and static (a
// fixed list of hosts).
var builtinFleetingPlugins = map[string]func(self []string) (fleeting.InstanceGroup, map[string]func(context.Context, []string) error){
	"local": func(self []string) (fleeting.InstanceGroup, map[string]func(context.Context, []string) error) {
		// Instance servers are this program too.
		g := &local.Group{Config: local.Config{ServerArgv: append(self, local.ServerCommand)}}
		return g, map[string]func(context.Context, []string) error{local.ServerCommand: local.RunServer}
	},
	"static": func([]string) (fleeting.InstanceGroup, map[string]func(context.Context, []string) error) {
		return &static.Group{}, nil
	},
}

// builtinFleetingPlugin resolves a plugin reference no plugin program
// answers ("local", "fleeting-plugin-local") to a plugin this binary
// serves.
func builtinFleetingPlugin(ref string) (string, []string, bool) {
	name := strings.TrimPrefix(ref, host.BinaryPrefix)
	if _, ok := builtinFleetingPlugins[name]; !ok {
		return "", nil, false
	}
	exe, err := os.Executable()
	if err != nil {
		return "", nil, false
	}
	return exe, []string{"fleeting-plugin", name}, true
}

// newFleetingPluginCmd is "berth fleeting-plugin NAME": a built-in
// fleeting plugin, served the way a runner manager (Berth's or GitLab's)
// starts plugins.
func newFleetingPluginCmd() *cobra.Command {
	var names []string
	for n := range builtinFleetingPlugins {
		names = append(names, n)
	}
	sort.Strings(names)
	return &cobra.Command{
		Use:   "fleeting-plugin NAME [ARGS]",
		Short: "Serve a built-in fleeting plugin (" + strings.Join(names, ", ") + ")",
		Long: "Serve a built-in fleeting plugin over the fleeting plugin protocol. [runners.autoscaler] plugin = \"" +
			strings.Join(names, "\" or \"") + "\" finds it when no fleeting-plugin-* program of that name is in PATH.",
		Args:               cobra.MinimumNArgs(1),
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			mk, ok := builtinFleetingPlugins[args[0]]
			if !ok {
				return fmt.Errorf("no built-in fleeting plugin %q (have: %s)", args[0], strings.Join(names, ", "))
			}
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			g, cmds := mk([]string{exe, "fleeting-plugin", args[0]})
			code := sdk.Main(g, sdk.Options{Name: "fleeting-plugin-" + args[0], Version: version, Commands: cmds}, args[1:], cmd.OutOrStdout(), cmd.ErrOrStderr())
			if code != 0 {
				return &exitError{code: code, err: fmt.Errorf("fleeting-plugin %s exited with %d", args[0], code)}
			}
			return nil
		},
	}
}
