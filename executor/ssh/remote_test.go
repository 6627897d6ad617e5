package ssh

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/berthci/berth/internal/testenv"
)

func TestRemoteDir(t *testing.T) {
	for in, want := range map[string]string{
		"builds":       `"$h"/'builds'`,
		"~":            `"$h"`,
		"~/":           `"$h"`,
		"~/x/../y":     `"$h"/'y'`,
		".":            `"$h"`,
		"/srv/builds/": `'/srv/builds'`,
		"it's":         `"$h"/'it'\''s'`,
	} {
		if got := remoteDir(in); got != want {
			t.Errorf("remoteDir(%q) = %s, want %s", in, got, want)
		}
	}
}

// TestShellWords runs the quoting through a real sh.
func TestShellWords(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	for _, s := range []string{"plain", "with space", "it's", `back\slash`, "$HOME", "a\nb", "!bang", ""} {
		out, err := exec.Command(sh, "-c", "printf %s "+shq(s)).Output()
		if err != nil || string(out) != s {
			t.Errorf("shq(%q) through sh gave %q, %v", s, out, err)
		}
	}
	// The scripts themselves stay free of what some login shells
	// would interpret inside single quotes (fish: backslashes; csh:
	// '!' and newlines); the only backslashes are those of '\'' between
	// quoted parts.
	hb := helperBinary{sha: strings.Repeat("a", 64), size: 10}
	for _, script := range []string{
		probeScript("n", probeRequest{helper: hb, dirs: true, buildsDir: "builds", cacheDir: "/c", sub: "t/0/g/p"}),
		uploadScript("n", "/home/u/.cache/berth/helper/x/berth", hb),
		stageWrapper{nonce: "n", marker: "m", file: "/t/s.sh", dir: "/b", shell: "bash", helper: "/h"}.command(),
	} {
		if strings.ContainsAny(strings.ReplaceAll(script, `'\''`, ""), "\\!\n") {
			t.Errorf("script holds a backslash, '!' or a newline: %s", script)
		}
	}
}

func TestParseProbe(t *testing.T) {
	out := "welcome from .bashrc\nN home /home/ci\nN uname Linux ci-1 x86_64\nN bash\nN helper 123\nN build /home/ci/builds/t/0/g/p\nN cache /home/ci/cache\nN done\n"
	r, err := parseProbe("N", []byte(out))
	if err != nil {
		t.Fatal(err)
	}
	if r.home != "/home/ci" || r.os != "Linux" || r.host != "ci-1" || r.machine != "x86_64" || !r.bash ||
		r.helperSize != 123 || r.buildDir != "/home/ci/builds/t/0/g/p" || r.cacheDir != "/home/ci/cache" {
		t.Fatalf("%+v", r)
	}
	for name, bad := range map[string]string{
		"cut short":     "N home /h\n",
		"relative home": "N home h\nN uname Linux a b\nN done\n",
		"no uname":      "N home /h\nN done\n",
		"bad size":      "N home /h\nN uname Linux a b\nN helper x\nN done\n",
	} {
		if _, err := parseProbe("N", []byte(bad)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if r, err := parseProbe("N", []byte("N home /h\nN uname Linux a b\nN done\n")); err != nil || r.helperSize != -1 || r.bash {
		t.Errorf("no helper, no bash: %+v %v", r, err)
	}
}

func FuzzParseProbe(f *testing.F) {
	f.Add("N home /h\nN uname Linux a b\nN helper 5\nN done\n")
	f.Add("N uname \nN helper -1\nN done")
	f.Fuzz(func(t *testing.T, s string) {
		r, err := parseProbe("N", []byte(s))
		if err == nil && (!r.completed || r.home == "" || r.home[0] != '/' || r.helperSize < -1) {
			t.Fatalf("accepted %q as %+v", s, r)
		}
	})
}

func TestControl(t *testing.T) {
	var out testenv.SyncBuffer
	so := &stageOutput{w: &out}
	c := newControl("N", so)
	for _, chunk := range []string{"N re", "ady\nsh: oops\n", "N exit 4", "2\nN exit 7\ntrailing"} {
		c.Write([]byte(chunk))
	}
	c.flush()
	select {
	case <-c.ready:
	default:
		t.Error("ready not seen")
	}
	code, ok, _ := c.result()
	if !ok || code != 42 {
		t.Errorf("exit %d %v, want 42 (the first report wins)", code, ok)
	}
	if out.String() != "sh: oops\ntrailing" {
		t.Errorf("passed on %q", out.String())
	}
}

func FuzzControl(f *testing.F) {
	f.Add([]byte("N ready\nN exit 3\n"), 3)
	f.Add([]byte("N fail x\nN exit\nN exit -1\n"), 1)
	f.Fuzz(func(t *testing.T, b []byte, split int) {
		var out testenv.SyncBuffer
		c := newControl("N", &stageOutput{w: &out})
		if split < 0 || split > len(b) {
			split = len(b) / 2
		}
		c.Write(b[:split])
		c.Write(b[split:])
		c.flush()
		c.result()
	})
}
