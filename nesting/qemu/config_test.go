package qemu

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestParseConfigDefaults(t *testing.T) {
	want := DefaultConfig()
	want.StateDir, _ = DefaultStateDir()
	want.TemplateDir = filepath.Join(want.StateDir, "templates")
	for _, in := range []string{"", "  \n", "{}", `{"cpus": null, "accel": null}`} {
		got, err := ParseConfig([]byte(in))
		if err != nil {
			t.Fatalf("ParseConfig(%q): %v", in, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("ParseConfig(%q) = %+v, want %+v", in, got, want)
		}
	}
	if want.Machine != MachineMicroVM || want.CPUs != 1 || want.MemoryMB != 1024 || want.Accel != AccelAuto ||
		want.Network != NetworkUser || !want.BuildMissing || want.BootTimeout != 5*time.Minute || !want.WarmStart || want.WarmTemplates != 8 ||
		want.QEMU != "qemu-system-x86_64" || want.QEMUImg != "qemu-img" || want.Kernel != "" || want.ImageDir != "" {
		t.Errorf("defaults %+v", want)
	}
}

func TestDefaultStateDir(t *testing.T) {
	d, err := DefaultStateDir()
	if err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		if d != "/var/lib/berth/nesting" {
			t.Errorf("root's default state_dir %s, want /var/lib/berth/nesting", d)
		}
		return
	}
	t.Setenv("XDG_STATE_HOME", "/xdg/state")
	if d, _ := DefaultStateDir(); d != "/xdg/state/berth/nesting" {
		t.Errorf("with XDG_STATE_HOME: %s", d)
	}
	t.Setenv("XDG_STATE_HOME", "")
	home, _ := os.UserHomeDir()
	if d, _ := DefaultStateDir(); d != filepath.Join(home, ".local/state/berth/nesting") {
		t.Errorf("without XDG_STATE_HOME: %s", d)
	}
}

func TestParseConfigAllKeys(t *testing.T) {
	in := `{"machine": "q35", "cpus": 2, "memory_mb": 2048, "accel": "tcg", "network": "none",
		"state_dir": "/srv/nesting", "image_dir": "/srv/images", "kernel": "/boot/vmlinuz-x",
		"agent": "/opt/berth/berth", "build_missing": false, "boot_timeout": "90s", "warm_start": false, "warm_templates": 3, "max_branches": 2, "template_dir": "/srv/templates", "warm_images": ["debian:12", "ci/build:1"], "qemu": "/opt/qemu/bin/qemu-system-x86_64", "qemu_img": "/opt/qemu/bin/qemu-img"}`
	got, err := ParseConfig([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	want := Config{Machine: MachineQ35, CPUs: 2, MemoryMB: 2048, Accel: AccelTCG, Network: NetworkNone,
		StateDir: "/srv/nesting", ImageDir: "/srv/images", Kernel: "/boot/vmlinuz-x", Agent: "/opt/berth/berth", BuildMissing: false, WarmStart: false, WarmTemplates: 3, MaxBranches: 2, TemplateDir: "/srv/templates", WarmImages: []string{"debian:12", "ci/build:1"},
		BootTimeout: 90 * time.Second, QEMU: "/opt/qemu/bin/qemu-system-x86_64", QEMUImg: "/opt/qemu/bin/qemu-img"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
	// Every key of the table is documented by a field and parsed above.
	for k := range configKeys {
		if !strings.Contains(in, `"`+k+`"`) {
			t.Errorf("key %q is not covered by this test", k)
		}
	}
}

func TestParseConfigErrors(t *testing.T) {
	long := "/" + strings.Repeat("d", 80)
	for _, c := range []struct{ in, want string }{
		{`[]`, "want a JSON object"},
		{`null`, "want a JSON object"},
		{`"microvm"`, "want a JSON object"},
		{`{"machine": "microvm",`, "want a JSON object"},
		{`{"image": "debian"}`, `unknown key "image" (known: accel, agent, boot_timeout, build_missing, cpus, image_dir, kernel, machine, max_branches, memory_mb, network, qemu, qemu_img, state_dir, template_dir, warm_images, warm_start, warm_templates)`},
		{`{"warm_images": "debian:12"}`, `warm_images: want a list of image names, got "debian:12"`},
		{`{"warm_images": ["debian:12", " "]}`, "warm_images: entry 2 is empty"},
		{`{"warm_start": 1}`, `warm_start: want true or false, got 1`},
		{`{"warm_templates": 0}`, "warm_templates: 0: want 1 to 1000"},
		{`{"max_branches": -1}`, "max_branches: -1: want 0 (no branching) to 100"},
		{`{"Machine": "q35"}`, `unknown key "Machine"`},
		{`{"machine": "pc"}`, `machine: "pc": want "microvm" or "q35"`},
		{`{"machine": 35}`, "machine: want a string, got 35"},
		{`{"cpus": "2"}`, `cpus: want an integer, got "2"`},
		{`{"cpus": 1.5}`, "cpus: want an integer, got 1.5"},
		{`{"cpus": 0}`, "cpus: 0: want 1 to 255"},
		{`{"memory_mb": 64}`, "memory_mb: 64: want 128"},
		{`{"accel": "hvf"}`, `accel: "hvf": want "auto", "kvm" or "tcg"`},
		{`{"network": "bridge"}`, `network: "bridge": want "user" or "none"`},
		{`{"build_missing": "yes"}`, `build_missing: want true or false, got "yes"`},
		{`{"boot_timeout": 300}`, `boot_timeout: want a duration string such as "5m", got 300`},
		{`{"boot_timeout": "5 minutes"}`, `boot_timeout: want a duration such as "5m"`},
		{`{"boot_timeout": "-1s"}`, "boot_timeout: -1s: want a positive duration"},
		{`{"boot_timeout": "0s"}`, "boot_timeout: 0s: want a positive duration"},
		{`{"qemu": ""}`, "qemu: empty"},
		{`{"qemu_img": ""}`, "qemu_img: empty"},
		{`{"state_dir": "/srv/a,b"}`, "state_dir: \"/srv/a,b\" has a comma"},
		{`{"state_dir": "` + long + `"}`, "state_dir: " + long + " is too long"},
	} {
		_, err := ParseConfig([]byte(c.in))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseConfig(%s) = %v, want an error with %q", c.in, err, c.want)
		}
		if err != nil && !strings.HasPrefix(err.Error(), "qemu config: ") {
			t.Errorf("ParseConfig(%s): error %q does not say it is the qemu config's", c.in, err)
		}
	}
}

// FuzzParseConfig: any input gives a valid config or an error, never a
// panic.
func FuzzParseConfig(f *testing.F) {
	for _, s := range []string{"{}", `{"machine":"q35","cpus":2}`, `{"boot_timeout":"1m"}`, `{"x":1}`, `[1]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := ParseConfig(b)
		if err == nil {
			if verr := c.Validate(); verr != nil {
				t.Fatalf("ParseConfig(%q) returned a config Validate refuses: %v", b, verr)
			}
		}
	})
}
