package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/BurntSushi/toml"
	"github.com/spf13/cobra"

	"github.com/berthci/berth/executor"
	econfig "github.com/berthci/berth/executor/config"
	"github.com/berthci/berth/executor/custom"
	"github.com/berthci/berth/executor/docker"
	"github.com/berthci/berth/executor/microvm"
	"github.com/berthci/berth/executor/plugin"
	"github.com/berthci/berth/executor/plugin/sdk"
	"github.com/berthci/berth/executor/shell"
	"github.com/berthci/berth/executor/ssh"
)

// builtinPlugins are the built-in executors "berth executor-plugin NAME"
// serves out of process. Each builds its provider from the
// [runners.plugin.config] table, which holds the keys of the executor's
// own section ([runners.docker] for docker, …).
var builtinPlugins = map[string]func(ctx context.Context, s sdk.Setup) (executor.Provider, error){
	shell.Name: func(_ context.Context, s sdk.Setup) (executor.Provider, error) {
		var c struct{}
		if err := decodeSection(s.Config, "shell", &c); err != nil {
			return nil, err
		}
		return shell.New(shell.Config{Logger: s.Logger}), nil
	},
	docker.Name: func(ctx context.Context, s sdk.Setup) (executor.Provider, error) {
		var c econfig.Docker
		if err := decodeSection(s.Config, "docker", &c); err != nil {
			return nil, err
		}
		return docker.New(ctx, docker.Options{Config: c, Logger: s.Logger})
	},
	ssh.Name: func(_ context.Context, s sdk.Setup) (executor.Provider, error) {
		var c econfig.SSH
		if err := decodeSection(s.Config, "ssh", &c); err != nil {
			return nil, err
		}
		return ssh.New(ssh.Options{Config: c, Logger: s.Logger})
	},
	custom.Name: func(_ context.Context, s sdk.Setup) (executor.Provider, error) {
		var c econfig.Custom
		if err := decodeSection(s.Config, "custom", &c); err != nil {
			return nil, err
		}
		return custom.New(custom.Options{Config: c, Logger: s.Logger})
	},
	microvm.Name: func(_ context.Context, s sdk.Setup) (executor.Provider, error) {
		var c econfig.MicroVM
		if err := decodeSection(s.Config, "microvm", &c); err != nil {
			return nil, err
		}
		return newMicroVMProvider(c, s.RunnerName, s.Logger)
	},
}

// builtinPlugin resolves a [runners.plugin] name that no plugin program
// answers to a built-in executor served by this binary.
func builtinPlugin(name string) (plugin.Command, bool) {
	if _, ok := builtinPlugins[name]; !ok {
		return plugin.Command{}, false
	}
	exe, err := os.Executable()
	if err != nil {
		return plugin.Command{}, false
	}
	return plugin.Command{Path: exe, Args: []string{"executor-plugin", name}}, true
}

// decodeSection decodes a plugin configuration (JSON) into an executor's
// TOML section struct, refusing keys the section does not have.
func decodeSection(cfg json.RawMessage, section string, target any) error {
	var m map[string]any
	if len(bytes.TrimSpace(cfg)) > 0 {
		dec := json.NewDecoder(bytes.NewReader(cfg))
		dec.UseNumber()
		if err := dec.Decode(&m); err != nil {
			return fmt.Errorf("%w: %v", sdk.ErrConfig, err)
		}
		m = tomlNumbers(m).(map[string]any)
	}
	var buf bytes.Buffer
	if err := toml.NewEncoder(&buf).Encode(m); err != nil {
		return fmt.Errorf("%w: %v", sdk.ErrConfig, err)
	}
	md, err := toml.Decode(buf.String(), target)
	if err != nil {
		return fmt.Errorf("%w: [runners.plugin.config] as [runners.%s]: %v", sdk.ErrConfig, section, err)
	}
	if u := md.Undecoded(); len(u) > 0 {
		keys := make([]string, len(u))
		for i, k := range u {
			keys[i] = k.String()
		}
		return fmt.Errorf("%w: [runners.plugin.config]: the %s executor has no key %s", sdk.ErrConfig, section, strings.Join(keys, ", "))
	}
	return nil
}

// tomlNumbers turns the JSON numbers of v into TOML's integers where they
// are whole (config.toml's "timeout = 5" arrives as JSON 5) and floats
// otherwise.
func tomlNumbers(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = tomlNumbers(e)
		}
		return x
	case []any:
		for i, e := range x {
			x[i] = tomlNumbers(e)
		}
		return x
	case json.Number:
		if n, err := x.Int64(); err == nil {
			return n
		}
		f, _ := x.Float64()
		return f
	}
	return v
}

// newExecutorPluginCmd is "berth executor-plugin NAME": a built-in
// executor served as an executor plugin, the way a runner manager with
// executor = "plugin" and [runners.plugin] name = NAME starts it.
func newExecutorPluginCmd() *cobra.Command {
	var names []string
	for n := range builtinPlugins {
		names = append(names, n)
	}
	sort.Strings(names)
	return &cobra.Command{
		Use:   "executor-plugin NAME",
		Short: "Serve a built-in executor (" + strings.Join(names, ", ") + ") as an executor plugin",
		Long: "Serve a built-in executor out of process over the executor plugin protocol " +
			"(docs/executor-plugins.md). A runner manager starts it; run by hand it only says so.",
		Args:      cobra.RangeArgs(1, 2),
		ValidArgs: names,
		RunE: func(cmd *cobra.Command, args []string) error {
			newFn, ok := builtinPlugins[args[0]]
			if !ok {
				return fmt.Errorf("no built-in executor %q (have: %s)", args[0], strings.Join(names, ", "))
			}
			code := sdk.Main(sdk.Options{Name: args[0], Version: version, New: newFn}, args[1:], cmd.OutOrStdout(), cmd.ErrOrStderr())
			if code != 0 {
				return &exitError{code: code, err: fmt.Errorf("executor-plugin %s exited with %d", args[0], code)}
			}
			return nil
		},
	}
}
