package sdk

import (
	"bytes"
	"errors"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestDependencies keeps the SDK light: a plugin author who imports it
// must not pull in Berth's coordinator, runner, other executors or SQLite.
func TestDependencies(t *testing.T) {
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	out, err := exec.Command(goBin, "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list -deps listed only %v", deps)
	}
	for _, d := range deps {
		for _, banned := range []string{
			"github.com/berthci/berth/coordinator", "github.com/berthci/berth/runner",
			"github.com/berthci/berth/executor/shell", "github.com/berthci/berth/executor/docker",
			"github.com/berthci/berth/taskscaler", "github.com/berthci/berth/fleeting", "github.com/docker/",
		} {
			if d == banned || strings.HasPrefix(d, banned+"/") || (strings.HasSuffix(banned, "/") && strings.HasPrefix(d, banned)) {
				t.Errorf("the SDK depends on %s", d)
			}
		}
		if strings.Contains(d, "sqlite") {
			t.Errorf("the SDK depends on %s", d)
		}
	}
}

func TestCommands(t *testing.T) {
	var out, errb bytes.Buffer
	if code := Main(Options{Name: "berth-executor-x", Version: "v1.2.3"}, []string{"version"}, &out, &errb); code != 0 ||
		!strings.HasPrefix(out.String(), "berth-executor-x v1.2.3 (executor protocol 1)") {
		t.Fatalf("version: %d %q", code, out.String())
	}
	out.Reset()
	t.Setenv("BERTH_EXECUTOR_PLUGIN", "")
	if code := Main(Options{Name: "berth-executor-x"}, nil, &out, &errb); code != 1 || !strings.Contains(errb.String(), "runner manager starts it") {
		t.Fatalf("serve by hand: %d %q", code, errb.String())
	}
	errb.Reset()
	if code := Main(Options{Name: "berth-executor-x"}, []string{"frobnicate"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "unknown command") {
		t.Fatalf("unknown command: %d %q", code, errb.String())
	}
}

func TestDecodeConfig(t *testing.T) {
	var c struct {
		Dir   string `json:"dir"`
		Grace int    `json:"grace"`
	}
	if err := DecodeConfig([]byte(`{"dir":"/x","grace":3}`), &c); err != nil || c.Dir != "/x" || c.Grace != 3 {
		t.Fatalf("%+v %v", c, err)
	}
	if err := DecodeConfig(nil, &c); err != nil {
		t.Fatalf("empty config: %v", err)
	}
	for _, bad := range []string{`{"dri":"/x"}`, `{"grace":"three"}`, `[]`, `{"dir":"/x"} {"dir":"/y"}`} {
		err := DecodeConfig([]byte(bad), &c)
		if !errors.Is(err, ErrConfig) {
			t.Errorf("DecodeConfig(%s) = %v, want ErrConfig", bad, err)
		}
	}
}
