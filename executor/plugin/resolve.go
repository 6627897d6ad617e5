package plugin

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// BinaryPrefix starts the file name of every executor plugin found by
// name.
const BinaryPrefix = "berth-executor-"

// DirEnv names the executor plugin directory, searched after PATH.
const DirEnv = "BERTH_EXECUTOR_PLUGIN_DIR"

// ErrPluginNotFound: [runners.plugin] names no program that exists.
var ErrPluginNotFound = errors.New("executor plugin not found")

// Dir is the executor plugin directory: $BERTH_EXECUTOR_PLUGIN_DIR, else
// ~/.berth/executor-plugins.
func Dir() string {
	if d := os.Getenv(DirEnv); d != "" {
		return d
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".berth", "executor-plugins")
	}
	return ""
}

// Command is a resolved plugin: the program and its arguments.
type Command struct {
	Path string
	Args []string
}

// Resolve finds the plugin of a [runners.plugin] section:
//
//  1. path: that program (relative paths against the working directory);
//  2. name: berth-executor-<name> in PATH, then in dir (Dir() when "");
//  3. name: builtin(name), when it knows the name (the berth binary runs
//     its built-in executors out of process: berth executor-plugin shell).
func Resolve(name, path string, args []string, dir string, builtin func(name string) (Command, bool)) (Command, error) {
	if path != "" {
		abs, err := filepath.Abs(path)
		if err != nil {
			return Command{}, err
		}
		if err := executable(abs); err != nil {
			return Command{}, fmt.Errorf("%w: %s: %v", ErrPluginNotFound, path, err)
		}
		return Command{Path: abs, Args: args}, nil
	}
	if name == "" || strings.ContainsAny(name, `/\`) || name == "." || name == ".." {
		return Command{}, fmt.Errorf("%w: invalid plugin name %q", ErrPluginNotFound, name)
	}
	bin := BinaryPrefix + name
	if p, err := exec.LookPath(bin); err == nil {
		abs, _ := filepath.Abs(p)
		return Command{Path: abs, Args: args}, nil
	}
	if dir == "" {
		dir = Dir()
	}
	var tried []string
	tried = append(tried, bin+" in PATH")
	if dir != "" {
		p := filepath.Join(dir, bin)
		if executable(p) == nil {
			return Command{Path: p, Args: args}, nil
		}
		tried = append(tried, p)
	}
	if builtin != nil {
		if c, ok := builtin(name); ok {
			c.Args = append(c.Args, args...)
			return c, nil
		}
	}
	return Command{}, fmt.Errorf("%w: %q (looked for %s)", ErrPluginNotFound, name, strings.Join(tried, ", "))
}

func executable(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return errors.New("is a directory")
	}
	if fi.Mode()&0o111 == 0 {
		return errors.New("is not executable")
	}
	return nil
}
