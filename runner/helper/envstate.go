package helper

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
)

// The shell state a parallel:matrix job's before_script leaves, carried
// from the stage that ran it to the stage that runs the script (a branch
// of the VM it ran in, for the matrix's other jobs). env-save writes the
// environment and working directory of the shell that runs it; env-restore
// prints the shell commands that make another shell's environment and
// directory what changed between two saves: the variables the commands
// in between set, changed or unset (before_script runs with set -a, so
// plain assignments are in the environment too), and its directory.

// envState is what env-save writes.
type envState struct {
	Env []string `json:"env"`
	Dir string   `json:"dir"`
}

// envIgnored are the shell's own variables, never carried.
var envIgnored = map[string]bool{"PWD": true, "OLDPWD": true, "SHLVL": true, "_": true}

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// envSave writes this process's environment and directory to path.
func envSave(path string) error {
	dir, err := os.Getwd()
	if err != nil {
		return err
	}
	b, err := json.Marshal(envState{Env: os.Environ(), Dir: dir})
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}

func readEnvState(path string) (map[string]string, string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, "", err
	}
	var st envState
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, "", fmt.Errorf("%s: %w", path, err)
	}
	m := map[string]string{}
	for _, kv := range st.Env {
		if k, v, ok := strings.Cut(kv, "="); ok && envName.MatchString(k) && !envIgnored[k] {
			m[k] = v
		}
	}
	return m, st.Dir, nil
}

// envRestore writes to w the shell commands that apply what changed from
// the save in before to the one in after.
func envRestore(w io.Writer, before, after string) error {
	b, _, err := readEnvState(before)
	if err != nil {
		return err
	}
	a, dir, err := readEnvState(after)
	if err != nil {
		return err
	}
	var out strings.Builder
	for _, k := range slices.Sorted(maps.Keys(a)) {
		if old, ok := b[k]; !ok || old != a[k] {
			fmt.Fprintf(&out, "export %s=%s\n", k, shellQuote(a[k]))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(b)) {
		if _, ok := a[k]; !ok {
			fmt.Fprintf(&out, "unset %s\n", k)
		}
	}
	if dir != "" {
		fmt.Fprintf(&out, "cd %s\n", shellQuote(dir))
	}
	_, err = io.WriteString(w, out.String())
	return err
}

// shellQuote quotes s for any POSIX shell.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
