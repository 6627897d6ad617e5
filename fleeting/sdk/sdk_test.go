package sdk

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestDependencies keeps the SDK light: a plugin author who imports it must
// not pull in Berth's coordinator, runner or executors, nor SQLite.
func TestDependencies(t *testing.T) {
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	for _, pkg := range []string{".", "../plugins/fake", "../plugins/static", "../plugins/local"} {
		out, err := exec.Command(goBin, "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		deps := strings.Fields(string(out))
		if len(deps) < 10 {
			t.Fatalf("go list -deps %s listed only %v", pkg, deps)
		}
		for _, d := range deps {
			for _, banned := range []string{
				"github.com/berthci/berth/coordinator",
				"github.com/berthci/berth/runner",
				"github.com/berthci/berth/executor",
				"github.com/berthci/berth/taskscaler",
				"sqlite",
			} {
				if d == banned || strings.HasPrefix(d, banned+"/") || (banned == "sqlite" && strings.Contains(d, "sqlite")) {
					t.Errorf("%s depends on %s", pkg, d)
				}
			}
		}
	}
}

func TestVersionCommand(t *testing.T) {
	var out, errb bytes.Buffer
	code := run(nil, Options{Name: "fleeting-plugin-x", Version: "v1.2.3"}, []string{"version"}, &out, &errb)
	if code != 0 || !strings.HasPrefix(out.String(), "fleeting-plugin-x v1.2.3 (go") {
		t.Fatalf("version: exit %d, output %q", code, out.String())
	}
}

func TestCommands(t *testing.T) {
	var got []string
	opts := Options{Name: "p", Commands: map[string]func(context.Context, []string) error{
		"hello": func(_ context.Context, args []string) error { got = args; return nil },
		"fail":  func(context.Context, []string) error { return errors.New("no") },
	}}
	var out, errb bytes.Buffer
	if code := run(nil, opts, []string{"hello", "a", "b"}, &out, &errb); code != 0 || strings.Join(got, ",") != "a,b" {
		t.Errorf("hello: exit %d, args %v", code, got)
	}
	if code := run(nil, opts, []string{"fail"}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "p fail: no") {
		t.Errorf("fail: exit %d, stderr %q", code, errb.String())
	}
	errb.Reset()
	if code := run(nil, opts, []string{"nope"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "fail | hello") {
		t.Errorf("unknown: exit %d, stderr %q", code, errb.String())
	}
	// Started by hand (no magic cookie), serve explains itself.
	t.Setenv("FLEETING_INSTANCE_GROUP_PLUGIN", "")
	errb.Reset()
	if code := run(nil, opts, nil, &out, &errb); code != 1 || !strings.Contains(errb.String(), "is a fleeting plugin") {
		t.Errorf("serve without cookie: exit %d, stderr %q", code, errb.String())
	}
}

// TestLogHandlerWritesHclogJSON checks the fields and timestamp layout go-plugin
// hosts parse.
func TestLogHandlerWritesHclogJSON(t *testing.T) {
	var buf bytes.Buffer
	l := slog.New(NewLogHandler(&buf, slog.LevelDebug))
	l.Warn("disk full", "instance", "i-1", slog.Group("g", "k", 1))
	var m map[string]any
	if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
		t.Fatalf("%q: %v", buf.String(), err)
	}
	if m["@level"] != "warn" || m["@message"] != "disk full" || m["instance"] != "i-1" {
		t.Errorf("record %v", m)
	}
	ts, _ := m["@timestamp"].(string)
	if _, err := time.Parse("2006-01-02T15:04:05.000000Z07:00", ts); err != nil {
		t.Errorf("@timestamp %q does not parse with hclog's layout: %v", ts, err)
	}
	if g, ok := m["g"].(map[string]any); !ok || g["k"] != float64(1) {
		t.Errorf("group attribute lost: %v", m)
	}
}
