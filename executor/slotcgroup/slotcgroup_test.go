package slotcgroup

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func TestExpand(t *testing.T) {
	for _, tc := range []struct {
		template string
		slot     int
		want     string // "" means an error is expected
		errHas   string
	}{
		{DefaultTemplate, 0, "gitlab-runner/slot-0", ""},
		{DefaultTemplate, 17, "gitlab-runner/slot-17", ""},
		{"runner/$slot", 3, "runner/3", ""},
		{"runner-slot-${slot}.slice", 2, "runner-slot-2.slice", ""},
		{"a/${slot}/b/$slot", 5, "a/5/b/5", ""},
		// GitLab's rule: every other name expands to empty.
		{"ci-$HOME-${USER}x/slot-${slot}", 1, "ci--x/slot-1", ""},
		{"ci$slots/s-$slot", 1, "ci/s-1", ""}, // $slots is another name
		{"ci/${slot}${nope}", 4, "ci/4", ""},
		{"ci/$1$*$@slot-$slot", 4, "ci/slot-4", ""}, // special parameters are names too
		// No placeholder: accepted (GitLab only warns).
		{"shared/cgroup", 9, "shared/cgroup", ""},
		{"user@1:x+y=z_w.v-u/s", 0, "user@1:x+y=z_w.v-u/s", ""},
		// Rejects.
		{"../x", 0, "", `".." path element`},
		{"a/../b", 0, "", `".." path element`},
		{"a/./b", 0, "", `"." path element`},
		{"/abs/slot-${slot}", 0, "", "absolute"},
		{"a//b", 0, "", "empty path element"},
		{"a/b/", 0, "", "empty path element"},
		{"a b/${slot}", 0, "", `' '`},
		{"$(rm)/${slot}", 0, "", `'$'`},
		{"`id`/${slot}", 0, "", "'`'"},
		{"a;b", 0, "", `';'`},
		{"a'b", 0, "", `'\''`},
		{"a\nb", 0, "", `'\n'`},
		{"slot-é", 0, "", `'é'`},
		{"x/*", 0, "", `'*'`},
		{"$HOME", 0, "", "empty path"},
		{"", 0, "", "empty path"},
		{"${slot}/${nope}", 0, "", "empty path element"},
		{"${slot", 0, "slot", ""}, // bad syntax: os.Expand eats "${"
		{DefaultTemplate, -1, "", "no slot"},
	} {
		got, err := Expand(tc.template, tc.slot)
		if tc.want == "" {
			if err == nil {
				t.Errorf("Expand(%q, %d) = %q, want an error", tc.template, tc.slot, got)
			} else if !strings.Contains(err.Error(), tc.errHas) || !strings.Contains(err.Error(), "slot cgroup template") {
				t.Errorf("Expand(%q, %d) error %q, want it to contain %q and name the template", tc.template, tc.slot, err, tc.errHas)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("Expand(%q, %d) = %q, %v; want %q", tc.template, tc.slot, got, err, tc.want)
		}
	}
}

func TestHasPlaceholder(t *testing.T) {
	for template, want := range map[string]bool{
		DefaultTemplate:         true,
		"x/$slot":               true,
		"x/${slot}.slice":       true,
		"$slot":                 true,
		"x/slot":                false,
		"x/$slots":              false,
		"x/${slots}":            false,
		"x/${slot":              false,
		"x/$$slot":              false, // $$ is a special parameter, then the text "slot"
		"x/${SLOT}":             false,
		"runner-slot-0.slice":   false,
		"gitlab-runner/${nope}": false,
	} {
		if got := HasPlaceholder(template); got != want {
			t.Errorf("HasPlaceholder(%q) = %v, want %v", template, got, want)
		}
	}
}

func TestLimits(t *testing.T) {
	for _, tc := range []struct {
		l      Limits
		zero   bool
		quota  int64
		mem    int64
		errHas []string // every one must appear; nil: valid
	}{
		{l: Limits{}, zero: true},
		{l: Limits{CPUs: " ", Memory: "\t"}, zero: true},
		{l: Limits{CPUs: "1.5"}, quota: 150000},
		{l: Limits{CPUs: "0.5"}, quota: 50000},
		{l: Limits{CPUs: "2"}, quota: 200000},
		{l: Limits{CPUs: "0.01"}, quota: 1000},
		{l: Limits{CPUs: ".25"}, quota: 25000},
		{l: Limits{CPUs: "3."}, quota: 300000},
		{l: Limits{CPUs: "0.333333"}, quota: 33333},
		{l: Limits{CPUs: " 1 "}, quota: 100000},
		{l: Limits{Memory: "512m"}, mem: 512 << 20},
		{l: Limits{Memory: "2g"}, mem: 2 << 30},
		{l: Limits{Memory: "2GB"}, mem: 2 << 30},
		{l: Limits{Memory: "64M"}, mem: 64 << 20},
		{l: Limits{Memory: "1048576000"}, mem: 1048576000},
		{l: Limits{Memory: "1.5g"}, mem: 3 << 29},
		{l: Limits{Pids: 64}},
		{l: Limits{Pids: 4194304}},
		{l: Limits{CPUs: "1", Memory: "1g", Pids: 100}, quota: 100000, mem: 1 << 30},
		{l: Limits{CPUs: "abc"}, errHas: []string{"cpus:", `"abc"`}},
		{l: Limits{CPUs: "-1"}, errHas: []string{"cpus:"}},
		{l: Limits{CPUs: "0"}, errHas: []string{"cpus:", "at least 0.01"}},
		{l: Limits{CPUs: "0.001"}, errHas: []string{"cpus:", "at least 0.01"}},
		{l: Limits{CPUs: "1e3"}, errHas: []string{"cpus:", "decimal"}},
		{l: Limits{CPUs: "Inf"}, errHas: []string{"cpus:"}},
		{l: Limits{CPUs: "NaN"}, errHas: []string{"cpus:"}},
		{l: Limits{CPUs: "1,5"}, errHas: []string{"cpus:"}},
		{l: Limits{CPUs: "2000000"}, errHas: []string{"cpus:", "at most"}},
		{l: Limits{Memory: "lots"}, errHas: []string{"memory:", `"lots"`}},
		{l: Limits{Memory: "-1"}, errHas: []string{"memory:"}},
		{l: Limits{Memory: "0"}, errHas: []string{"memory:", "at least 6m"}},
		{l: Limits{Memory: "1m"}, errHas: []string{"memory:", "at least 6m"}},
		{l: Limits{Pids: -1}, errHas: []string{"pids:", "negative"}},
		{l: Limits{Pids: 4194305}, errHas: []string{"pids:", "at most 4194304"}},
		{l: Limits{CPUs: "x", Memory: "y", Pids: -2}, errHas: []string{"cpus:", "memory:", "pids:"}},
	} {
		err := tc.l.Validate()
		if tc.errHas == nil {
			if err != nil {
				t.Errorf("%+v: Validate() = %v", tc.l, err)
				continue
			}
		} else {
			if err == nil {
				t.Errorf("%+v: Validate() = nil, want an error", tc.l)
				continue
			}
			for _, s := range tc.errHas {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("%+v: Validate() = %q, want it to contain %q", tc.l, err, s)
				}
			}
			continue
		}
		if got := tc.l.IsZero(); got != tc.zero {
			t.Errorf("%+v: IsZero() = %v, want %v", tc.l, got, tc.zero)
		}
		if q, _ := tc.l.cfsQuota(); q != tc.quota {
			t.Errorf("%+v: quota %d, want %d", tc.l, q, tc.quota)
		}
		if m, _ := tc.l.memoryBytes(); m != tc.mem {
			t.Errorf("%+v: memory %d, want %d", tc.l, m, tc.mem)
		}
	}
	if (Limits{Pids: 1}).IsZero() || (Limits{CPUs: "1"}).IsZero() || (Limits{Memory: "1g"}).IsZero() {
		t.Error("IsZero is true for limits that set something")
	}
}

func TestDetect(t *testing.T) {
	for _, tc := range []struct {
		name  string
		build func(root string)
		want  Version
	}{
		{"v2", func(r string) { write(t, filepath.Join(r, "cgroup.controllers"), "cpu memory pids\n") }, V2},
		{"v2 without controllers", func(r string) { write(t, filepath.Join(r, "cgroup.controllers"), "") }, V2},
		{"v1 memory", func(r string) { mkdir(t, filepath.Join(r, "memory")) }, V1},
		{"v1 pids", func(r string) { write(t, filepath.Join(r, "pids", "cgroup.procs"), "") }, V1},
		{"hybrid", func(r string) {
			mkdir(t, filepath.Join(r, "memory"))
			write(t, filepath.Join(r, "unified", "cgroup.controllers"), "")
		}, V1},
		{"v1 without memory or pids", func(r string) { mkdir(t, filepath.Join(r, "cpu")) }, Unsupported},
		{"memory is a file", func(r string) { write(t, filepath.Join(r, "memory"), "") }, Unsupported},
		{"empty", func(string) {}, Unsupported},
	} {
		root := t.TempDir()
		tc.build(root)
		if got := Detect(root); got != tc.want {
			t.Errorf("%s: Detect = %v, want %v", tc.name, got, tc.want)
		}
	}
	if got := Detect(filepath.Join(t.TempDir(), "absent")); got != Unsupported {
		t.Errorf("absent root: Detect = %v", got)
	}
	// "" is /sys/fs/cgroup: it must agree with what that tree shows.
	want := Unsupported
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		want = V2
	} else if fi, err := os.Stat("/sys/fs/cgroup/memory"); err == nil && fi.IsDir() {
		want = V1
	} else if fi, err := os.Stat("/sys/fs/cgroup/pids"); err == nil && fi.IsDir() {
		want = V1
	}
	if got := Detect(""); got != want {
		t.Errorf(`Detect("") = %v, /sys/fs/cgroup shows %v`, got, want)
	}
	if V1.String() != "v1" || V2.String() != "v2" || Unsupported.String() != "unsupported" {
		t.Errorf("String: %v %v %v", V1, V2, Unsupported)
	}
}

func TestShq(t *testing.T) {
	for in, want := range map[string]string{
		"":       `''`,
		"a/b":    `'a/b'`,
		"it's":   `'it'\''s'`,
		"$(x) `": `'$(x) ` + "`'",
	} {
		if got := shq(in); got != want {
			t.Errorf("shq(%q) = %s, want %s", in, got, want)
		}
	}
}

// pathRE is the shape of every path Expand may return, written
// independently of its checks.
var pathRE = regexp.MustCompile(`^[A-Za-z0-9._@:+=-]+(/[A-Za-z0-9._@:+=-]+)*$`)

func FuzzExpand(f *testing.F) {
	for _, s := range []string{
		DefaultTemplate, "runner-slot-${slot}.slice", "$slot", "${slot}/..", "../$slot", "/a/$slot",
		"a//$slot", "$(rm -rf /)", "${slot", "$$", "${}", "$", "a/$HOME/$slot", "./x", "x/.",
	} {
		f.Add(s, 0)
		f.Add(s, 7)
	}
	f.Fuzz(func(t *testing.T, template string, slot int) {
		p, err := Expand(template, slot)
		if err != nil {
			if p != "" {
				t.Fatalf("Expand(%q, %d) = %q with error %v", template, slot, p, err)
			}
			return
		}
		if slot < 0 {
			t.Fatalf("Expand(%q, %d) accepted a negative slot", template, slot)
		}
		if !pathRE.MatchString(p) {
			t.Fatalf("Expand(%q, %d) = %q: not a relative path of allowed characters", template, slot, p)
		}
		for _, e := range strings.Split(p, "/") {
			if e == "." || e == ".." {
				t.Fatalf("Expand(%q, %d) = %q: has a %q element", template, slot, p, e)
			}
		}
		if filepath.Clean(p) != p || filepath.IsAbs(p) {
			t.Fatalf("Expand(%q, %d) = %q: not clean", template, slot, p)
		}
		if !HasPlaceholder(template) {
			if q, err := Expand(template, slot+1); slot < 1<<30 && (err != nil || q != p) {
				t.Fatalf("template %q has no placeholder but expands differently per slot: %q, %q (%v)", template, p, q, err)
			}
		}
	})
}

func write(t testing.TB, name, content string) {
	t.Helper()
	mkdir(t, filepath.Dir(name))
	if err := os.WriteFile(name, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func mkdir(t testing.TB, name string) {
	t.Helper()
	if err := os.MkdirAll(name, 0o755); err != nil {
		t.Fatal(err)
	}
}
