package docker

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/berthci/berth/runner/config"
)

func TestParseSettingsNamesTheKey(t *testing.T) {
	neg := -3
	for _, tc := range []struct {
		name string
		cfg  config.Docker
		key  string
	}{
		{"memory", config.Docker{Memory: "12x"}, "docker.memory"},
		{"memory too small", config.Docker{Memory: "1k"}, "docker.memory"},
		{"memory_swap", config.Docker{Memory: "1g", MemorySwap: "lots"}, "docker.memory_swap"},
		{"memory_swap below memory", config.Docker{Memory: "1g", MemorySwap: "512m"}, "docker.memory_swap"},
		{"memory_swap without memory", config.Docker{MemorySwap: "1g"}, "docker.memory_swap"},
		{"cpus", config.Docker{CPUs: "one"}, "docker.cpus"},
		{"cpus zero", config.Docker{CPUs: "0"}, "docker.cpus"},
		{"cpus NaN", config.Docker{CPUs: "NaN"}, "docker.cpus"},
		{"shm_size", config.Docker{ShmSize: -1}, "docker.shm_size"},
		{"volume relative", config.Docker{Volumes: []string{"cache"}}, "docker.volumes[0]"},
		{"volume mode", config.Docker{Volumes: []string{"/ok", "/h:/c:rx"}}, "docker.volumes[1]"},
		{"volume four parts", config.Docker{Volumes: []string{"/a:/b:ro:x"}}, "docker.volumes[0]"},
		{"volume relative source", config.Docker{Volumes: []string{"./h:/c"}}, "docker.volumes[0]"},
		{"volume twice", config.Docker{Volumes: []string{"/cache", "/h:/cache"}}, "docker.volumes[1]"},
		{"volume root", config.Docker{Volumes: []string{"/h:/"}}, "docker.volumes[0]"},
		{"device", config.Docker{Devices: []string{"dev/null"}}, "docker.devices[0]"},
		{"device perms", config.Docker{Devices: []string{"/dev/a:/dev/b:rwx"}}, "docker.devices[0]"},
		{"dns", config.Docker{DNS: []string{"8.8.8.8", "resolver"}}, "docker.dns[1]"},
		{"extra_hosts", config.Docker{ExtraHosts: []string{"db"}}, "docker.extra_hosts[0]"},
		{"extra_hosts ip", config.Docker{ExtraHosts: []string{"db:nowhere"}}, "docker.extra_hosts[0]"},
		{"tmpfs", config.Docker{Tmpfs: map[string]string{"tmp": ""}}, "docker.tmpfs"},
		{"services_tmpfs", config.Docker{ServicesTmpfs: map[string]string{"var": ""}}, "docker.services_tmpfs"},
		{"network_mode", config.Docker{NetworkMode: "my net"}, "docker.network_mode"},
		{"pull_policy", config.Docker{PullPolicy: config.StringList{"sometimes"}}, "docker.pull_policy[0]"},
		{"allowed_pull_policies", config.Docker{AllowedPullPolicies: []string{"never", "often"}}, "docker.allowed_pull_policies[1]"},
		{"allowed_images", config.Docker{AllowedImages: []string{"ruby:[2"}}, "docker.allowed_images[0]"},
		{"allowed_services", config.Docker{AllowedServices: []string{"{a,b"}}, "docker.allowed_services[0]"},
		{"image", config.Docker{Image: "Alpine:3"}, "docker.image"},
		{"service name", config.Docker{Services: []config.DockerService{{Name: "ok"}, {Name: "bad name"}}}, "docker.services[1].name"},
		{"service no name", config.Docker{Services: []config.DockerService{{}}}, "docker.services[0].name"},
		{"service environment", config.Docker{Services: []config.DockerService{{Name: "db", Variables: []string{"NOEQUALS"}}}}, "docker.services[0].environment[0]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseSettings(tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.key) {
				t.Fatalf("parseSettings: %v, want an error naming %s", err, tc.key)
			}
		})
	}
	s, err := parseSettings(config.Docker{ServicesLimit: &neg})
	if err != nil || s.servicesLimit != -1 {
		t.Fatalf("negative services_limit: %v %d, want unlimited", err, s.servicesLimit)
	}
}

func TestParseSettingsValues(t *testing.T) {
	two := 2
	s, err := parseSettings(config.Docker{
		CPUs: "1.5", Memory: "512m", MemorySwap: "-1", Volumes: []string{"/cache", "/srv/data:/data:ro,z", "named:/named"},
		Devices: []string{"/dev/fuse", "/dev/a:rw", "/dev/b:/dev/c:r"}, ExtraHosts: []string{"db:10.0.0.2", "gw:host-gateway", "v6:::1"},
		ServicesLimit: &two, WaitForServicesTimeout: -1, NetworkMode: "container:abc",
	})
	if err != nil {
		t.Fatal(err)
	}
	if s.nanoCPUs != 1_500_000_000 || s.memory != 512<<20 || s.memorySwap != -1 {
		t.Errorf("cpus %d memory %d swap %d", s.nanoCPUs, s.memory, s.memorySwap)
	}
	want := []volumeSpec{{Target: "/cache"}, {Source: "/srv/data", Target: "/data", Mode: "ro,z"}, {Source: "named", Target: "/named"}}
	if !reflect.DeepEqual(s.volumes, want) {
		t.Errorf("volumes %+v", s.volumes)
	}
	if !s.volumes[0].cache() || s.volumes[1].bind() != "/srv/data:/data:ro,z" {
		t.Errorf("volume kinds: %+v", s.volumes)
	}
	if d := s.devices; len(d) != 3 || d[0].PathInContainer != "/dev/fuse" || d[1].CgroupPermissions != "rw" || d[2].PathInContainer != "/dev/c" || d[2].CgroupPermissions != "r" {
		t.Errorf("devices %+v", d)
	}
	if s.servicesLimit != 2 || s.servicesTimeout != 0 {
		t.Errorf("services limit %d timeout %s", s.servicesLimit, s.servicesTimeout)
	}
	if !reflect.DeepEqual(s.pullPolicies, []string{"always"}) || !reflect.DeepEqual(s.allowedPullPolicies, []string{"always"}) {
		t.Errorf("pull policies %v allowed %v, want GitLab's default always", s.pullPolicies, s.allowedPullPolicies)
	}
}

func TestResolvePullPolicies(t *testing.T) {
	for _, tc := range []struct {
		name             string
		config, allowed  []string
		job, want        []string
		notAllowed, fail bool
	}{
		{name: "default", want: []string{"always"}},
		{name: "config list", config: []string{"if-not-present", "always"}, want: []string{"if-not-present", "always"}},
		{name: "job within default allowed", config: []string{"never", "if-not-present"}, job: []string{"if-not-present"}, want: []string{"if-not-present"}},
		{name: "job outside default allowed", config: []string{"if-not-present"}, job: []string{"always"}, notAllowed: true},
		{name: "intersection keeps the job's order", allowed: []string{"never", "if-not-present"}, job: []string{"always", "if-not-present", "never"}, want: []string{"if-not-present", "never"}},
		{name: "config outside allowed", config: []string{"always"}, allowed: []string{"never"}, notAllowed: true},
		{name: "unknown job policy", job: []string{"sometimes"}, fail: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := parseSettings(config.Docker{PullPolicy: tc.config, AllowedPullPolicies: tc.allowed})
			if err != nil {
				t.Fatal(err)
			}
			got, err := s.resolvePullPolicies("img", tc.job)
			switch {
			case tc.notAllowed:
				if !errors.Is(err, ErrNotAllowed) || !strings.Contains(err.Error(), "allowed_pull_policies") {
					t.Fatalf("%v %v, want ErrNotAllowed naming allowed_pull_policies", got, err)
				}
			case tc.fail:
				if err == nil {
					t.Fatalf("accepted %v", got)
				}
			default:
				if err != nil || !reflect.DeepEqual(got, tc.want) {
					t.Fatalf("%v %v, want %v", got, err, tc.want)
				}
			}
		})
	}
}

func TestDerivedAliases(t *testing.T) {
	for image, want := range map[string][]string{
		"postgres":                {"postgres"},
		"postgres:15":             {"postgres"},
		"berth-test/httpd:latest": {"berth-test__httpd", "berth-test-httpd"},
		"registry.example.com:5000/group/img:1.0":                              {"registry.example.com__group__img", "registry.example.com-group-img"},
		"registry.example.com/group/sub/img@sha256:" + strings.Repeat("a", 64): {"registry.example.com__group__sub__img", "registry.example.com-group-sub-img"},
		"tutum/wordpress:latest":                                               {"tutum__wordpress", "tutum-wordpress"},
		"localhost:5000/redis":                                                 {"localhost__redis", "localhost-redis"},
	} {
		if got := derivedAliases(image); !reflect.DeepEqual(got, want) {
			t.Errorf("derivedAliases(%q) = %v, want %v", image, got, want)
		}
	}
	if got := splitAliases("db, pg  other,,x"); !reflect.DeepEqual(got, []string{"db", "pg", "other", "x"}) {
		t.Errorf("splitAliases: %v", got)
	}
	if got := appendUnique([]string{"a", "b"}, "b", "c"); !reflect.DeepEqual(got, []string{"a", "b", "c"}) {
		t.Errorf("appendUnique: %v", got)
	}
}

func TestGlob(t *testing.T) {
	for _, tc := range []struct {
		pattern string
		yes, no []string
	}{
		{"ruby:*", []string{"ruby:3.2", "ruby:latest"}, []string{"ruby", "ruby:3/x", "jruby:1"}},
		{"*/*:*", []string{"group/img:1"}, []string{"img:1", "a/b/c:1"}},
		{"registry.example.com/**", []string{"registry.example.com/a/b/c:1"}, []string{"registry.example.com", "other.com/a"}},
		{"python:3.1?", []string{"python:3.11"}, []string{"python:3.1", "python:3.111"}},
		{"{alpine,debian}:*", []string{"alpine:3", "debian:12"}, []string{"ubuntu:22.04"}},
		{"img:[0-9]*", []string{"img:1.0"}, []string{"img:latest"}},
		{"img:[!0-9]*", []string{"img:latest"}, []string{"img:1"}},
		{`a\*b`, []string{"a*b"}, []string{"axb"}},
		{"docker.io/library/*", []string{"docker.io/library/alpine"}, []string{"alpine"}},
	} {
		g, err := compileGlob(tc.pattern)
		if err != nil {
			t.Fatalf("%s: %v", tc.pattern, err)
		}
		for _, s := range tc.yes {
			if !g.match(s) {
				t.Errorf("%q does not match %q", tc.pattern, s)
			}
		}
		for _, s := range tc.no {
			if g.match(s) {
				t.Errorf("%q matches %q", tc.pattern, s)
			}
		}
	}
	for _, bad := range []string{"", "a[", "a{b", `a\`, "[]"} {
		if _, err := compileGlob(bad); err == nil {
			t.Errorf("compileGlob(%q) accepted", bad)
		}
	}
}

func TestNames(t *testing.T) {
	n := naming{short: "abc", rawShort: "abc", systemID: "s_1", jobID: 7, projectID: 3, project: "g/p", slot: 1, instance: "0123abcd"}
	if got := n.buildName(); got != "runner-abc-project-3-concurrent-1-0123abcd-build" {
		t.Errorf("build name %q", got)
	}
	if got := n.serviceName("registry:5000/g/pg:15", 0); got != "runner-abc-project-3-concurrent-1-0123abcd-registry-5000__g__pg-0" {
		t.Errorf("service name %q", got)
	}
	if got := n.networkName(); got != "runner-abc-3-1-7" {
		t.Errorf("network name %q", got)
	}
	if n.buildsVolume("/builds") == (naming{short: "abc", projectID: 3, project: "g/p", slot: 2}).buildsVolume("/builds") {
		t.Error("builds volumes of two slots share a name")
	}
	if n.cacheVolume("/cache") != (naming{short: "abc", projectID: 3, project: "g/p", slot: 2}).cacheVolume("/cache") {
		t.Error("cache volumes differ between slots of one project")
	}
	if h := (naming{short: strings.Repeat("x", 60), instance: "1"}).hostname(); len(h) > 63 {
		t.Errorf("hostname %q longer than 63", h)
	}
	l := n.labels(typeBuild)
	for _, k := range []string{LabelManaged, LabelShortToken, LabelSystemID, LabelJobID, LabelInstance, LabelSlot, LabelProject, LabelType, labelGitLab + "job.id", labelGitLabMgd} {
		if l[k] == "" {
			t.Errorf("build label %s missing: %v", k, l)
		}
	}
	if v := n.labels(typeBuilds); v[LabelJobID] != "" || v[LabelInstance] != "" {
		t.Errorf("persistent volume carries job labels: %v", v)
	}
}

func TestHealthPorts(t *testing.T) {
	exposed := map[string]struct{}{"8080/tcp": {}, "53/udp": {}, "80/tcp": {}}
	if got, err := healthPorts(nil, exposed); err != nil || !reflect.DeepEqual(got, []int{80, 8080}) {
		t.Errorf("%v %v", got, err)
	}
	if got, err := healthPorts([]string{"HEALTHCHECK_TCP_PORT=9000"}, exposed); err != nil || !reflect.DeepEqual(got, []int{9000}) {
		t.Errorf("%v %v", got, err)
	}
	if _, err := healthPorts([]string{"HEALTHCHECK_TCP_PORT=http"}, exposed); err == nil {
		t.Error("bad HEALTHCHECK_TCP_PORT accepted")
	}
}

func FuzzParseVolume(f *testing.F) {
	for _, s := range []string{"/cache", "/h:/c", "/h:/c:ro", "name:/c:rw,z", "a:b:c:d", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := parseVolume(s)
		if err != nil {
			return
		}
		if !strings.HasPrefix(v.Target, "/") || v.Target == "/" {
			t.Fatalf("%q: accepted target %q", s, v.Target)
		}
		if !v.cache() && v.bind() == "" {
			t.Fatalf("%q: empty bind", s)
		}
	})
}

func FuzzCompileGlob(f *testing.F) {
	for _, s := range []string{"ruby:*", "**", "{a,b}", "[!x]", `\*`} {
		f.Add(s, "ruby:3")
	}
	f.Fuzz(func(t *testing.T, pattern, name string) {
		g, err := compileGlob(pattern)
		if err != nil {
			return
		}
		_ = g.match(name)
	})
}

func FuzzDerivedAliases(f *testing.F) {
	for _, s := range []string{"postgres:15", "a/b:c", "r:5000/x/y@sha256:" + strings.Repeat("0", 64)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, image string) {
		if _, err := parseImageName(image); err != nil {
			return
		}
		for _, a := range derivedAliases(image) {
			if a == "" || strings.Contains(a, "/") {
				t.Fatalf("%q: alias %q", image, a)
			}
		}
	})
}
