package runner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/runner/helper"
)

// fileStep is one step of a stage that only moves files (restore_cache,
// download_artifacts, archive_cache, upload_artifacts_*,
// cleanup_file_variables). Such a stage is rendered as a script that runs
// the helper inside the job's environment — or, when the environment's
// files are the runner's own (executor.Environment.Local), run in the
// runner's process: the same helper code, without a shell and a helper
// process per stage.
type fileStep struct {
	// color and msg: a line for the job log ("" none).
	color, msg string
	// args: a helper command (`berth helper ARGS…`); nil for none.
	args []string
	// token authenticates the helper command against the coordinator.
	token string
	// urls are pre-signed URLs of a distributed cache for the helper
	// command. Like the token they are credentials: they reach a helper
	// in the environment through its environment, never its command line.
	urls []string
	// orWarn: when the command fails, print this and go on (else the
	// stage fails with the command's exit status).
	orWarn string
	// fail: the stage fails here (exit status 1), after msg.
	fail bool
	// removeAll: a path to remove with everything below it.
	removeAll string
	// gitConfigs: a repository whose git configuration and hooks to
	// remove (clean_git_config), with its submodules' when gitModules.
	gitConfigs string
	gitModules bool
}

// fileScript renders steps as a stage script ("" when there are none).
func (s *scripts) fileScript(steps []fileStep) string {
	if len(steps) == 0 {
		return ""
	}
	var b strings.Builder
	for _, st := range steps {
		if st.msg != "" {
			echoInfo(&b, st.color, st.msg)
		}
		if st.args != nil {
			if st.token != "" {
				fmt.Fprintf(&b, "%s=%s ", helper.TokenEnv, shq(st.token))
			}
			if len(st.urls) > 0 {
				fmt.Fprintf(&b, "%s=%s ", helper.CacheURLsEnv, shq(strings.Join(st.urls, "\n")))
			}
			b.WriteString(s.helper())
			for _, a := range st.args {
				b.WriteString(" " + shq(a))
			}
			if st.orWarn != "" {
				b.WriteString(" || echo " + shq(st.orWarn))
			}
			b.WriteString("\n")
		}
		if st.removeAll != "" {
			fmt.Fprintf(&b, "rm -rf %s\n", shq(st.removeAll))
		}
		if st.gitConfigs != "" {
			fmt.Fprintf(&b, "if [ -d %s ]; then %s; fi\n", shq(path.Join(st.gitConfigs, ".git")), gitConfigCleanup(st.gitConfigs, st.gitModules))
		}
		if st.fail {
			b.WriteString("exit 1\n")
		}
	}
	if !slices.ContainsFunc(steps, func(st fileStep) bool { return st.removeAll == "" && st.gitConfigs == "" }) {
		// cleanup_file_variables needs neither the variables nor the
		// project directory (which may be gone).
		return b.String()
	}
	return s.optional(b.String())
}

// runFileSteps runs steps in this process, writing what the script would
// print to out. It fails as the script would: an *executor.ExitError with
// the failing command's status.
func runFileSteps(ctx context.Context, stage string, steps []fileStep, out io.Writer, run func(ctx context.Context, args []string, out io.Writer) int) error {
	for _, st := range steps {
		if err := ctx.Err(); err != nil {
			return err
		}
		if st.msg != "" {
			fmt.Fprintf(out, "%s%s%s\n", st.color, st.msg, ansiReset)
		}
		if st.args != nil {
			args := st.args
			if st.token != "" {
				args = append(append([]string{}, args...), "--token", st.token)
			}
			for _, u := range st.urls {
				args = append(append([]string{}, args...), "--url", u)
			}
			if code := run(ctx, args, out); code != 0 {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				if st.orWarn == "" {
					return &executor.ExitError{Stage: stage, Code: code}
				}
				fmt.Fprintln(out, st.orWarn)
			}
		}
		if st.removeAll != "" {
			if err := os.RemoveAll(st.removeAll); err != nil {
				fmt.Fprintf(out, "rm: %v\n", err)
				return &executor.ExitError{Stage: stage, Code: 1}
			}
		}
		if st.gitConfigs != "" {
			if err := removeGitConfigs(st.gitConfigs, st.gitModules); err != nil {
				fmt.Fprintf(out, "rm: %v\n", err)
				return &executor.ExitError{Stage: stage, Code: 1}
			}
		}
		if st.fail {
			return &executor.ExitError{Stage: stage, Code: 1}
		}
	}
	return nil
}

// removeGitConfigs does here what gitConfigCleanup's command does in the
// job's environment.
func removeGitConfigs(dir string, modules bool) error {
	git := filepath.Join(dir, ".git")
	if _, err := os.Stat(git); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err := os.Remove(filepath.Join(git, "config")); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := os.RemoveAll(filepath.Join(git, "hooks")); err != nil {
		return err
	}
	if !modules {
		return nil
	}
	root := filepath.Join(git, "modules")
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case p == root:
			return nil
		case d.IsDir() && d.Name() == "hooks":
			if err := os.RemoveAll(p); err != nil {
				return err
			}
			return fs.SkipDir
		case d.Type().IsRegular() && d.Name() == "config":
			return os.Remove(p)
		}
		return nil
	})
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}
