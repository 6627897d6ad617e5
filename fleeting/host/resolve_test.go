package host_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/berthci/berth/fleeting/host"
)

func touch(t *testing.T, p string) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestParseReference(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want host.Reference
		bad  bool
	}{
		{in: "aws", want: host.Reference{Registry: "registry.gitlab.com", Namespace: "gitlab-org/fleeting/plugins", Name: "aws", Constraint: "latest"}},
		{in: "aws:1", want: host.Reference{Registry: "registry.gitlab.com", Namespace: "gitlab-org/fleeting/plugins", Name: "aws", Constraint: "1"}},
		{in: "myorg/hetzner:1.2", want: host.Reference{Registry: "registry.gitlab.com", Namespace: "myorg", Name: "hetzner", Constraint: "1.2"}},
		{in: "ghcr.io/acme/fleet/proxmox:0.3.1", want: host.Reference{Registry: "ghcr.io", Namespace: "acme/fleet", Name: "proxmox", Constraint: "0.3.1"}},
		{in: "localhost:5000/ns/p", want: host.Reference{Registry: "localhost:5000", Namespace: "ns", Name: "p", Constraint: "latest"}},
		{in: "", bad: true},
		{in: "aws:1.2.3.4", bad: true},
		{in: "aws:x", bad: true},
		{in: "ghcr.io/p", bad: true},
		{in: "a//b", bad: true},
		{in: "../x", bad: true},
	} {
		got, err := host.ParseReference(tc.in)
		if tc.bad {
			if err == nil {
				t.Errorf("ParseReference(%q) = %+v, want an error", tc.in, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseReference(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

func TestResolve(t *testing.T) {
	dir := t.TempDir()
	file := touch(t, filepath.Join(dir, "somewhere", "my-plugin"))
	bin := touch(t, filepath.Join(dir, "bin", "fleeting-plugin-foo"))
	t.Setenv("PATH", filepath.Join(dir, "bin"))
	inst := filepath.Join(dir, "installed")
	repo := filepath.Join(inst, "registry.gitlab.com", "gitlab-org", "fleeting", "plugins", "aws")
	v100 := touch(t, filepath.Join(repo, "1.0.0", "plugin"))
	v120 := touch(t, filepath.Join(repo, "1.2.0", "plugin"))
	v121 := touch(t, filepath.Join(repo, "v1.2.1", "plugin"))
	touch(t, filepath.Join(repo, "2.0.0-rc1", "plugin"))
	upper := touch(t, filepath.Join(inst, "ghcr.io", "!acme", "!big!plugin", "0.1.0", "plugin"))

	for _, tc := range []struct {
		ref  string
		want string
	}{
		{file, file},
		{"fleeting-plugin-foo", bin},
		{"aws", v121},
		{"aws:latest", v121},
		{"aws:1", v121},
		{"aws:1.0", v100},
		{"aws:1.2.0", v120},
		{"ghcr.io/Acme/BigPlugin", upper},
	} {
		got, err := host.Resolve(tc.ref, inst)
		if err != nil || got != tc.want {
			t.Errorf("Resolve(%q) = %q, %v; want %q", tc.ref, got, err, tc.want)
		}
	}
	for _, ref := range []string{"fleeting-plugin-bar", "aws:2", "aws:3.0", "gcp", "/nonexistent/plugin", ""} {
		if got, err := host.Resolve(ref, inst); err == nil {
			t.Errorf("Resolve(%q) = %q, want an error", ref, got)
		} else if ref != "" && !errors.Is(err, host.ErrPluginNotFound) {
			t.Errorf("Resolve(%q) error %v does not wrap ErrPluginNotFound", ref, err)
		}
	}

	found, err := host.List(inst)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, f := range found {
		names[f.Name+"@"+f.Version] = true
	}
	for _, want := range []string{"fleeting-plugin-foo@", "registry.gitlab.com/gitlab-org/fleeting/plugins/aws@1.0.0",
		"registry.gitlab.com/gitlab-org/fleeting/plugins/aws@v1.2.1", "ghcr.io/Acme/BigPlugin@0.1.0"} {
		if !names[want] {
			t.Errorf("List misses %s; got %v", want, names)
		}
	}
}

func FuzzParseReference(f *testing.F) {
	for _, s := range []string{"aws", "aws:1.2", "ghcr.io/a/b/c:latest", "localhost:5000/x/y", "a/b:1.2.3", ":", "a:"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := host.ParseReference(s)
		if err != nil {
			return
		}
		if r.Name == "" || r.Registry == "" || r.Namespace == "" || r.Constraint == "" {
			t.Fatalf("ParseReference(%q) = %+v with an empty part", s, r)
		}
		// A parsed reference parses to itself when written out in full.
		r2, err := host.ParseReference(r.String())
		if err != nil || r2 != r {
			t.Fatalf("ParseReference(%q) = %+v; its String %q parses to %+v, %v", s, r, r.String(), r2, err)
		}
	})
}
