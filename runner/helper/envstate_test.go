package helper

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func writeState(t *testing.T, st envState) string {
	t.Helper()
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "state.json")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestEnvRestore: what changed between two saves — set, changed, unset,
// the directory — is applied to another shell with values of any kind,
// and nothing else: the other shell's own values stay.
func TestEnvRestore(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	dir := t.TempDir()
	odd := "it's \"quoted\"\nwith $HOME and `cmd` and \\"
	before := writeState(t, envState{Env: []string{"KEEP=same", "CHANGED=old", "GONE=x", "OWN=prefix", "PWD=/a", "SHLVL=1", "bad-name=1"}, Dir: "/"})
	after := writeState(t, envState{Env: []string{"KEEP=same", "CHANGED=new", "NEW=" + odd, "OWN=prefix", "PWD=/b", "SHLVL=2", "bad-name=2"}, Dir: dir})
	var out bytes.Buffer
	if err := envRestore(&out, before, after); err != nil {
		t.Fatal(err)
	}
	for _, unwanted := range []string{"KEEP", "OWN", "PWD", "SHLVL", "bad-name"} {
		if strings.Contains(out.String(), unwanted) {
			t.Errorf("restore touches %s:\n%s", unwanted, out.String())
		}
	}
	cmd := exec.Command(sh, "-c", `eval "$1"; printf '%s|%s|%s|%s|%s' "$CHANGED" "$NEW" "${GONE-unset}" "$OWN" "$(pwd)"`, "sh", out.String())
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "CHANGED=mine", "GONE=mine", "OWN=mine", "KEEP=mine"}
	got, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	if want := "new|" + odd + "|unset|mine|" + dir; string(got) != want {
		t.Errorf("got %q\nwant %q", got, want)
	}
}

func TestEnvRestoreErrors(t *testing.T) {
	good := writeState(t, envState{})
	bad := filepath.Join(t.TempDir(), "bad.json")
	os.WriteFile(bad, []byte("{"), 0o600)
	for _, c := range [][2]string{{good, bad}, {bad, good}, {good, filepath.Join(t.TempDir(), "missing")}} {
		if err := envRestore(&bytes.Buffer{}, c[0], c[1]); err == nil {
			t.Errorf("%s %s: no error", c[0], c[1])
		}
	}
	if code := Run(t.Context(), []string{"env-restore", good}, &bytes.Buffer{}, &bytes.Buffer{}, nil, ""); code != 2 {
		t.Errorf("env-restore with one file: exit %d, want 2", code)
	}
}
