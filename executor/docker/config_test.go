package docker

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/network"

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
		{"hostname", config.Docker{Hostname: "my host"}, "docker.hostname"},
		{"hostname too long", config.Docker{Hostname: strings.Repeat("h", 64)}, "docker.hostname"},
		{"runtime", config.Docker{Runtime: " runc"}, "docker.runtime"},
		{"cpu_shares", config.Docker{CPUShares: -1}, "docker.cpu_shares"},
		{"cpuset_cpus", config.Docker{CPUSetCPUs: "0-"}, "docker.cpuset_cpus"},
		{"cpuset_cpus descending", config.Docker{CPUSetCPUs: "3-1"}, "docker.cpuset_cpus"},
		{"cpuset_mems", config.Docker{CPUSetMems: "all"}, "docker.cpuset_mems"},
		{"memory_reservation", config.Docker{MemoryReservation: "lots"}, "docker.memory_reservation"},
		{"memory_reservation above memory", config.Docker{Memory: "256m", MemoryReservation: "512m"}, "docker.memory_reservation"},
		{"oom_score_adjust", config.Docker{OomScoreAdjust: 1001}, "docker.oom_score_adjust"},
		{"group_add", config.Docker{GroupAdd: []string{"ok", ""}}, "docker.group_add[1]"},
		{"userns_mode", config.Docker{UsernsMode: "private"}, "docker.userns_mode"},
		{"pid_mode", config.Docker{PidMode: "container:"}, "docker.pid_mode"},
		{"pid_mode unknown", config.Docker{PidMode: "shared"}, "docker.pid_mode"},
		{"ipcmode", config.Docker{IpcMode: "everything"}, "docker.ipcmode"},
		{"ipcmode container", config.Docker{IpcMode: "container:"}, "docker.ipcmode"},
		{"sysctls", config.Docker{Sysctls: map[string]string{"not a sysctl": "1"}}, "docker.sysctls"},
		{"ulimit value", config.Docker{Ulimit: map[string]string{"nofile": "x"}}, `docker.ulimit: "nofile": want SOFT[:HARD], got "x"`},
		{"ulimit hard", config.Docker{Ulimit: map[string]string{"nofile": "1024:many"}}, `docker.ulimit: "nofile"`},
		{"ulimit soft above hard", config.Docker{Ulimit: map[string]string{"nofile": "2048:1024"}}, `docker.ulimit: "nofile"`},
		{"ulimit name", config.Docker{Ulimit: map[string]string{"files": "1024"}}, `docker.ulimit: "files"`},
		{"device_cgroup_rules", config.Docker{DeviceCgroupRules: []string{"c 1:3 mr", "x 1:3 r"}}, "docker.device_cgroup_rules[1]"},
		{"device_cgroup_rules access", config.Docker{DeviceCgroupRules: []string{"c 1:3 rwx"}}, "docker.device_cgroup_rules[0]"},
		{"links", config.Docker{Links: []string{"db:a:b"}}, "docker.links[0]"},
		{"links empty alias", config.Docker{Links: []string{"db:"}}, "docker.links[0]"},
		{"mac_address", config.Docker{MacAddress: "92:d0:c6:0a:29"}, "docker.mac_address"},
		{"log_options", config.Docker{LogOptions: map[string]string{"max-size": "10m"}}, "docker.log_options"},
		{"volumes_from", config.Docker{VolumesFrom: []string{"data:rx"}}, "docker.volumes_from[0]"},
		{"volumes_from name", config.Docker{VolumesFrom: []string{":ro"}}, "docker.volumes_from[0]"},
		{"volume_driver", config.Docker{VolumeDriver: "my driver"}, "docker.volume_driver"},
		{"volume_driver_ops", config.Docker{VolumeDriverOps: map[string]string{"": "x"}}, "docker.volume_driver_ops"},
		{"network_mtu", config.Docker{NetworkMTU: 20}, "docker.network_mtu"},
		{"allowed_privileged_images", config.Docker{AllowedPrivilegedImages: []string{"docker:*", "dind:[1"}}, "docker.allowed_privileged_images[1]"},
		{"allowed_privileged_services", config.Docker{AllowedPrivilegedServices: []string{"{a"}}, "docker.allowed_privileged_services[0]"},
		{"allowed_users", config.Docker{AllowedUsers: []string{" "}}, "docker.allowed_users[0]"},
		{"service_cpus", config.Docker{ServiceCPUs: "half"}, "docker.service_cpus"},
		{"service_cpu_shares", config.Docker{ServiceCPUShares: -2}, "docker.service_cpu_shares"},
		{"service_cpuset_cpus", config.Docker{ServiceCPUSetCPUs: "a"}, "docker.service_cpuset_cpus"},
		{"service_memory", config.Docker{ServiceMemory: "1q"}, "docker.service_memory"},
		{"service_memory_swap", config.Docker{ServiceMemory: "1g", ServiceMemorySwap: "x"}, "docker.service_memory_swap"},
		{"service_memory_swap without service_memory", config.Docker{ServiceMemorySwap: "1g"}, "docker.service_memory_swap"},
		{"service_memory_swap below service_memory", config.Docker{ServiceMemory: "1g", ServiceMemorySwap: "512m"}, "docker.service_memory_swap"},
		{"service_memory_reservation", config.Docker{ServiceMemoryReservation: "2k"}, "docker.service_memory_reservation"},
		{"service_memory_reservation above service_memory", config.Docker{ServiceMemory: "64m", ServiceMemoryReservation: "1g"}, "docker.service_memory_reservation"},
		{"services_devices pattern", config.Docker{ServicesDevices: map[string][]string{"pg:[": {"/dev/null"}}}, `docker.services_devices["pg:["]`},
		{"services_devices device", config.Docker{ServicesDevices: map[string][]string{"pg:*": {"/dev/null", "dev/zero"}}}, `docker.services_devices["pg:*"][1]`},
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

// TestContainerKeys checks where each of gitlab-runner's container keys
// lands: the build container, the services, or both, as gitlab-runner's
// createHostConfig and createHostConfigForService put them.
func TestContainerKeys(t *testing.T) {
	yes, no := true, false
	s, err := parseSettings(config.Docker{
		Hostname: "job-host", Runtime: "runc", CPUShares: 512, CPUSetCPUs: "0-1,3", CPUSetMems: "0",
		Memory: "1g", MemoryReservation: "512m", OomKillDisable: true, OomScoreAdjust: -500,
		GroupAdd: []string{"audio", "1234"}, UsernsMode: "host", PidMode: "container:other", IpcMode: "shareable",
		Sysctls:           map[string]string{"net.ipv4.ip_forward": "1"},
		Ulimit:            map[string]string{"nofile": "1024:2048", "nproc": "512", "core": "-1"},
		DeviceCgroupRules: []string{"c 1:3 mr", "b *:* rwm"}, Links: []string{"db:database", "/cache"},
		MacAddress: "92:D0:C6:0A:29:33", LogOptions: map[string]string{"env": "CI_JOB_ID", "labels": "team"},
		VolumesFrom: []string{"data:ro", "more"}, VolumeDriver: "local", VolumeDriverOps: map[string]string{"type": "tmpfs"},
		NetworkMTU: 1400, EnableIPv6: true,
		Privileged: true, AllowedPrivilegedImages: []string{"docker:*"}, AllowedPrivilegedServices: []string{"docker:*-dind"},
		ServicesSecurityOpt: []string{"no-new-privileges"},
		ServicesDevices:     map[string][]string{"postgres:*": {"/dev/null:/dev/pg-null:r"}, "**": {"/dev/zero"}},
		ServiceCPUs:         "0.5", ServiceCPUShares: 256, ServiceCPUSetCPUs: "1",
		ServiceMemory: "256m", ServiceMemorySwap: "512m", ServiceMemoryReservation: "128m",
		SecurityOpt: []string{"label=disable"}, CapAdd: []string{"NET_ADMIN"},
	})
	if err != nil {
		t.Fatal(err)
	}

	var b container.HostConfig
	s.applyBuild(&b, "docker:27")
	r := b.Resources
	if !b.Privileged || b.Runtime != "runc" || !reflect.DeepEqual(b.GroupAdd, []string{"audio", "1234"}) || b.UsernsMode != "host" ||
		b.PidMode != "container:other" || b.IpcMode != "shareable" || !reflect.DeepEqual(b.Links, []string{"db:database", "/cache"}) ||
		b.OomScoreAdj != -500 || b.VolumeDriver != "local" || !reflect.DeepEqual(b.VolumesFrom, []string{"data:ro", "more"}) ||
		b.Sysctls["net.ipv4.ip_forward"] != "1" {
		t.Errorf("build host config %+v", b)
	}
	if b.LogConfig.Type != "json-file" || b.LogConfig.Config["env"] != "CI_JOB_ID" || b.LogConfig.Config["labels"] != "team" {
		t.Errorf("build log config %+v", b.LogConfig)
	}
	if r.MemoryReservation != 512<<20 || r.CpusetCpus != "0-1,3" || r.CpusetMems != "0" || r.CPUShares != 512 ||
		r.OomKillDisable == nil || !*r.OomKillDisable || len(r.DeviceCgroupRules) != 2 {
		t.Errorf("build resources %+v", r)
	}
	ulimits := map[string][2]int64{}
	for _, u := range r.Ulimits {
		ulimits[u.Name] = [2]int64{u.Soft, u.Hard}
	}
	if !reflect.DeepEqual(ulimits, map[string][2]int64{"nofile": {1024, 2048}, "nproc": {512, 512}, "core": {-1, -1}}) {
		t.Errorf("ulimits %v", ulimits)
	}
	var notAllowed container.HostConfig
	s.applyBuild(&notAllowed, "alpine:3")
	if notAllowed.Privileged {
		t.Error("alpine:3 runs privileged, outside allowed_privileged_images")
	}

	var svc container.HostConfig
	s.applyService(&svc, "docker:27-dind")
	sr := svc.Resources
	if !svc.Privileged || svc.Runtime != "runc" || svc.UsernsMode != "host" || !reflect.DeepEqual(svc.SecurityOpt, []string{"no-new-privileges"}) ||
		svc.LogConfig.Config["env"] != "CI_JOB_ID" {
		t.Errorf("service host config %+v", svc)
	}
	// The build container's keys stay off the services, as in gitlab-runner.
	if svc.PidMode != "" || svc.IpcMode != "" || len(svc.GroupAdd) != 0 || len(svc.Sysctls) != 0 || len(svc.Links) != 0 ||
		len(svc.VolumesFrom) != 0 || svc.OomScoreAdj != 0 || len(sr.Ulimits) != 0 || sr.OomKillDisable != nil || len(sr.DeviceCgroupRules) != 0 || sr.CpusetMems != "" {
		t.Errorf("build-only keys on a service: %+v", svc)
	}
	if sr.NanoCPUs != 500_000_000 || sr.CPUShares != 256 || sr.CpusetCpus != "1" || sr.Memory != 256<<20 || sr.MemorySwap != 512<<20 || sr.MemoryReservation != 128<<20 {
		t.Errorf("service resources %+v", sr)
	}
	if len(sr.Devices) != 1 || sr.Devices[0].PathOnHost != "/dev/zero" {
		t.Errorf("services_devices of docker:27-dind: %+v", sr.Devices)
	}
	var pg container.HostConfig
	s.applyService(&pg, "postgres:16")
	if pg.Privileged {
		t.Error("postgres:16 runs privileged, outside allowed_privileged_services")
	}
	if d := pg.Resources.Devices; len(d) != 2 || d[0].PathInContainer != "/dev/zero" || d[1].PathInContainer != "/dev/pg-null" || d[1].CgroupPermissions != "r" {
		t.Errorf("services_devices of postgres:16: %+v", d)
	}

	// services_privileged overrides privileged for services, both ways.
	for _, tc := range []struct {
		privileged bool
		services   *bool
		want       bool
	}{{true, nil, true}, {true, &no, false}, {false, &yes, true}, {false, nil, false}} {
		s2, err := parseSettings(config.Docker{Privileged: tc.privileged, ServicesPrivileged: tc.services})
		if err != nil {
			t.Fatal(err)
		}
		var hc container.HostConfig
		s2.applyService(&hc, "any:1")
		if hc.Privileged != tc.want {
			t.Errorf("privileged %v services_privileged %v: service privileged %v", tc.privileged, tc.services, hc.Privileged)
		}
	}

	// The per-job network.
	no6, _ := parseSettings(config.Docker{})
	if o := no6.networkOptions(nil); o.EnableIPv6 != nil || len(o.Options) != 0 || o.Driver != "bridge" {
		t.Errorf("default network options %+v", o)
	}
	if o := s.networkOptions(nil); o.EnableIPv6 == nil || !*o.EnableIPv6 || o.Options["com.docker.network.driver.mtu"] != "1400" {
		t.Errorf("network options %+v", o)
	}
	if v := s.anonymousVolume(nil); v.DriverConfig == nil || v.DriverConfig.Name != "local" || v.DriverConfig.Options["type"] != "tmpfs" {
		t.Errorf("anonymous volume options %+v", v)
	}
	if v := no6.anonymousVolume(nil); v.DriverConfig != nil {
		t.Errorf("anonymous volume without volume_driver: %+v", v.DriverConfig)
	}
	if no6.logConfig.Type != "json-file" || no6.logConfig.Config != nil {
		t.Errorf("default log config %+v, want json-file as gitlab-runner", no6.logConfig)
	}

	// mac_address: container-wide before API 1.44, per endpoint since.
	var cfg container.Config
	var nc *network.NetworkingConfig
	s.applyMAC("1.41", &cfg, &nc, "job-net")
	if cfg.MacAddress != "92:d0:c6:0a:29:33" || nc != nil { //nolint:staticcheck
		t.Errorf("API 1.41: config mac %q, networking %+v", cfg.MacAddress, nc) //nolint:staticcheck
	}
	cfg = container.Config{}
	nc = &network.NetworkingConfig{EndpointsConfig: map[string]*network.EndpointSettings{"job-net": {Aliases: []string{"build"}}}}
	s.applyMAC("1.47", &cfg, &nc, "job-net")
	if ep := nc.EndpointsConfig["job-net"]; cfg.MacAddress != "" || ep.MacAddress != "92:d0:c6:0a:29:33" || len(ep.Aliases) != 1 { //nolint:staticcheck
		t.Errorf("API 1.47: config mac %q, endpoint %+v", cfg.MacAddress, ep) //nolint:staticcheck
	}
}

// TestAllowedUsers follows gitlab-runner's IsUserAllowed.
func TestAllowedUsers(t *testing.T) {
	for _, tc := range []struct {
		user    string
		allowed []string
		job     string
		ok      bool
	}{
		{job: "", ok: true},
		{job: "anyone", ok: true},
		{user: "runner", job: "runner", ok: true},
		{user: "runner", job: "other", ok: false},
		{allowed: []string{"1000", "nobody"}, job: "nobody", ok: true},
		{allowed: []string{"1000", "nobody"}, job: "root", ok: false},
		{allowed: []string{"1000"}, job: "", ok: true},
		{user: "root", allowed: []string{"1000"}, job: "root", ok: false},
	} {
		s, err := parseSettings(config.Docker{User: tc.user, AllowedUsers: tc.allowed})
		if err != nil {
			t.Fatal(err)
		}
		if got := s.allowedUser(tc.job); got != tc.ok {
			t.Errorf("user %q allowed_users %v: %q allowed %v, want %v", tc.user, tc.allowed, tc.job, got, tc.ok)
		}
	}
}

func TestEntrypointOverwrite(t *testing.T) {
	ep := []string{"sh", "-c"}
	s, _ := parseSettings(config.Docker{})
	var out strings.Builder
	if got := s.entrypoint(ep, &out); !reflect.DeepEqual(got, ep) || out.Len() != 0 {
		t.Errorf("entrypoint %v, output %q", got, out.String())
	}
	s, _ = parseSettings(config.Docker{DisableEntrypointOverwrite: true})
	if got := s.entrypoint(ep, &out); got != nil || !strings.Contains(out.String(), "Entrypoint override disabled") {
		t.Errorf("disable_entrypoint_overwrite: entrypoint %v, output %q", got, out.String())
	}
	out.Reset()
	if got := s.entrypoint(nil, &out); got != nil || out.Len() != 0 {
		t.Errorf("no entrypoint: %v, output %q", got, out.String())
	}
}
