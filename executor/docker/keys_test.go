package docker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/api/types/volume"

	"github.com/berthci/berth/runner/config"
	"github.com/berthci/berth/runnerapi"
)

// TestContainerKeysTakeEffect runs one job (a build container and one
// service) with gitlab-runner's container keys set and checks, through
// the engine and from inside the containers, that each reached the
// container gitlab-runner gives it to, and no other.
func TestContainerKeysTakeEffect(t *testing.T) {
	cli := dockerClient(t, busybox, httpd)
	ctx := context.Background()
	const short = "ctrkeys01"

	// A running container for volumes_from.
	other := fmt.Sprintf("berth-test-ctrkeys-%d", os.Getpid())
	oc, err := cli.ContainerCreate(ctx, &container.Config{Image: busybox, Cmd: []string{"sleep", "600"}, Volumes: map[string]struct{}{"/from-other": {}}},
		&container.HostConfig{Init: ptr(true)}, nil, nil, other)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cli.ContainerRemove(context.Background(), oc.ID, container.RemoveOptions{Force: true, RemoveVolumes: true})
	})
	if err := cli.ContainerStart(ctx, oc.ID, container.StartOptions{}); err != nil {
		t.Fatal(err)
	}

	serviceCPUs := "0"
	if runtime.NumCPU() > 1 {
		serviceCPUs = "0-1"
	}
	const mac = "92:d0:c6:0a:29:33"
	p := newProvider(t, cli, config.Docker{
		Hostname: "keys-host", Runtime: "runc", CPUShares: 512, CPUSetCPUs: "0", CPUSetMems: "0",
		Memory: "512m", MemoryReservation: "64m", OomKillDisable: true, OomScoreAdjust: 123,
		GroupAdd: []string{"4321"}, UsernsMode: "host", IpcMode: "shareable",
		Sysctls:           map[string]string{"net.ipv4.ip_forward": "1"},
		Ulimit:            map[string]string{"nofile": "1024:2048"},
		DeviceCgroupRules: []string{"c 1:3 mr"},
		MacAddress:        mac,
		LogOptions:        map[string]string{"labels": LabelType},
		VolumesFrom:       []string{other + ":ro"},
		VolumeDriver:      "local",
		VolumeDriverOps:   map[string]string{"type": "tmpfs", "device": "tmpfs", "o": "size=64m"},
		NetworkMTU:        1400,
		// Privileged containers cannot start on the development machines:
		// the allow lists keep both containers unprivileged.
		Privileged: true, AllowedPrivilegedImages: []string{"docker:*"}, AllowedPrivilegedServices: []string{"docker:*-dind"},
		ServicesSecurityOpt: []string{"no-new-privileges"},
		ServicesDevices:     map[string][]string{"berth-test/httpd:*": {"/dev/null:/dev/svc-null:r"}, "postgres:*": {"/dev/zero"}},
		ServiceCPUs:         "0.5", ServiceCPUShares: 256, ServiceCPUSetCPUs: serviceCPUs,
		ServiceMemory: "128m", ServiceMemorySwap: "256m", ServiceMemoryReservation: "32m",
	}, short)
	j := mustPrepare(t, p, opts(short, 40, &runnerapi.JobResponse{
		Image:    &runnerapi.Image{Name: busybox},
		Services: []runnerapi.Image{{Name: httpd, Alias: "web"}},
	}))
	if j.env.Hostname != "keys-host" {
		t.Errorf("environment host name %q", j.env.Hostname)
	}

	// From inside the build container.
	out := j.mustRun(`echo "host=$(hostname)"
echo "nofile=$(awk '/^Max open files/ {print $4 ":" $5}' /proc/1/limits)"
echo "ip_forward=$(cat /proc/sys/net/ipv4/ip_forward)"
echo "groups=$(id -G)"
echo "oom=$(cat /proc/1/oom_score_adj)"
echo "mtu=$(cat /sys/class/net/eth0/mtu)"
echo "mac=$(cat /sys/class/net/eth0/address)"
test -d /from-other && echo from-other-mounted
touch /from-other/x 2>/dev/null || echo from-other-read-only
echo "shares=$(cat /sys/fs/cgroup/cpu/cpu.shares 2>/dev/null || echo v2)"
echo "soft=$(cat /sys/fs/cgroup/memory/memory.soft_limit_in_bytes 2>/dev/null || echo v2)"
echo "cpuset=$(cat /sys/fs/cgroup/cpuset/cpuset.cpus 2>/dev/null || cat /sys/fs/cgroup/cpuset.cpus.effective)"`)
	for _, want := range []string{"host=keys-host", "nofile=1024:2048", "ip_forward=1", "4321", "oom=123", "mtu=1400", "mac=" + mac,
		"from-other-mounted", "from-other-read-only"} {
		if !strings.Contains(out, want) {
			t.Errorf("build container: output lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(out, "cpuset=0\n") {
		t.Errorf("build container: cpuset_cpus not in effect:\n%s", out)
	}
	// cgroup v2 writes shares and soft limits in its own units.
	if !strings.Contains(out, "shares=v2") && (!strings.Contains(out, "shares=512\n") || !strings.Contains(out, fmt.Sprintf("soft=%d\n", 64<<20))) {
		t.Errorf("build container: cpu_shares or memory_reservation not in effect:\n%s", out)
	}
	info, err := cli.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}

	cs, err := cli.ContainerList(ctx, container.ListOptions{Filters: filters.NewArgs(filters.Arg("label", LabelShortToken+"="+short))})
	if err != nil || len(cs) != 2 {
		t.Fatalf("containers %v %v", cs, err)
	}
	for _, c := range cs {
		ins, err := cli.ContainerInspect(ctx, c.ID)
		if err != nil {
			t.Fatal(err)
		}
		hc, r := ins.HostConfig, ins.HostConfig.Resources
		if hc.Runtime != "runc" || hc.UsernsMode != "host" || hc.LogConfig.Type != "json-file" || hc.LogConfig.Config["labels"] != LabelType {
			t.Errorf("%s: runtime %q userns %q log %+v", c.Names, hc.Runtime, hc.UsernsMode, hc.LogConfig)
		}
		if hc.Privileged {
			t.Errorf("%s runs privileged: its image is not in the allow list", c.Names)
		}
		switch ins.Config.Labels[LabelType] {
		case typeBuild:
			// links are not checked: the Engine drops them on a user-defined
			// network such as the job's (TestContainerKeys checks they are sent).
			if ins.Config.Hostname != "keys-host" || r.CPUShares != 512 || r.CpusetCpus != "0" || r.CpusetMems != "0" || r.MemoryReservation != 64<<20 ||
				(info.CgroupVersion == "1" && (r.OomKillDisable == nil || !*r.OomKillDisable)) || hc.OomScoreAdj != 123 || !slices.Equal(hc.GroupAdd, []string{"4321"}) ||
				hc.IpcMode != "shareable" || hc.Sysctls["net.ipv4.ip_forward"] != "1" || !slices.Equal(r.DeviceCgroupRules, []string{"c 1:3 mr"}) ||
				hc.VolumeDriver != "local" || !slices.Equal(hc.VolumesFrom, []string{other + ":ro"}) {
				t.Errorf("build container: hostname %q host config %+v", ins.Config.Hostname, hc)
			}
			if len(r.Ulimits) != 1 || r.Ulimits[0].Name != "nofile" || r.Ulimits[0].Soft != 1024 || r.Ulimits[0].Hard != 2048 {
				t.Errorf("build container ulimits %v", r.Ulimits)
			}
			if ins.Config.MacAddress != mac && !endpointMAC(ins, mac) { //nolint:staticcheck // API < 1.44
				t.Errorf("build container MAC address: %q, networks %v", ins.Config.MacAddress, ins.NetworkSettings.Networks) //nolint:staticcheck
			}
		case typeService:
			if r.NanoCPUs != 500_000_000 || r.CPUShares != 256 || r.CpusetCpus != serviceCPUs || r.Memory != 128<<20 || r.MemorySwap != 256<<20 ||
				r.MemoryReservation != 32<<20 || !slices.Equal(hc.SecurityOpt, []string{"no-new-privileges"}) {
				t.Errorf("service container resources %+v security %v", r, hc.SecurityOpt)
			}
			if len(r.Devices) != 1 || r.Devices[0].PathInContainer != "/dev/svc-null" {
				t.Errorf("service devices %+v, want only /dev/svc-null (its pattern)", r.Devices)
			}
			// The build container's keys stay off the service.
			if len(hc.Sysctls) != 0 || len(r.Ulimits) != 0 || len(hc.GroupAdd) != 0 || hc.OomScoreAdj != 0 || len(hc.Links) != 0 ||
				len(hc.VolumesFrom) != 0 || ins.Config.Hostname == "keys-host" || ins.Config.MacAddress == mac { //nolint:staticcheck
				t.Errorf("service container got build container keys: %+v", hc)
			}
			if sout, code, err := execIn(ctx, cli, c.ID, "sh", "-c", "test -c /dev/svc-null && echo svc-null; ulimit -n"); err != nil || code != 0 ||
				!strings.Contains(sout, "svc-null") || strings.TrimSpace(strings.TrimPrefix(sout, "svc-null\n")) == "1024" {
				t.Errorf("in the service: %q %d %v", sout, code, err)
			}
		}
	}

	// The per-job network has the MTU; the volumes Berth made, the driver.
	nw, err := cli.NetworkInspect(ctx, j.e.(*Executor).j.netMode, network.InspectOptions{})
	if err != nil || nw.Options["com.docker.network.driver.mtu"] != "1400" {
		t.Errorf("network %+v %v", nw.Options, err)
	}
	vs, err := cli.VolumeList(ctx, volume.ListOptions{Filters: filters.NewArgs(filters.Arg("label", LabelShortToken+"="+short))})
	if err != nil || len(vs.Volumes) == 0 {
		t.Fatalf("volumes %v %v", vs, err)
	}
	for _, v := range vs.Volumes {
		if v.Driver != "local" || v.Options["type"] != "tmpfs" {
			t.Errorf("volume %s (%s): driver %q options %v", v.Name, v.Labels[LabelType], v.Driver, v.Options)
		}
	}
}

// TestJobRestrictionKeys: allowed_users, disable_entrypoint_overwrite,
// volume_keep and enable_ipv6, on one build container.
func TestJobRestrictionKeys(t *testing.T) {
	cli := dockerClient(t, busybox)
	ctx := context.Background()
	const short = "jobrestr1"
	p := newProvider(t, cli, config.Docker{AllowedUsers: []string{"nobody"}, DisableEntrypointOverwrite: true, VolumeKeep: true}, short)
	asUser := func(id int64, user string, entrypoint ...string) executorOptsJob {
		return executorOptsJob{id: id, job: &runnerapi.JobResponse{Image: &runnerapi.Image{Name: busybox, Entrypoint: entrypoint,
			ExecutorOpts: &runnerapi.ExecutorOpts{Docker: &runnerapi.DockerOpts{User: runnerapi.FlexString(user)}}}}}
	}

	// A user outside allowed_users: refused before anything is created.
	root := asUser(41, "root")
	if _, err := prepare(t, p, opts(short, root.id, root.job)); !errors.Is(err, ErrNotAllowed) || !strings.Contains(err.Error(), "docker.allowed_users") {
		t.Fatalf("user root: %v, want ErrNotAllowed naming docker.allowed_users", err)
	}
	if l := leftovers(t, cli, short); len(l) > 0 {
		t.Fatalf("a refused job created %v", l)
	}

	// An allowed user, and an entrypoint that would stop the container
	// (see TestEntrypoint): the image's own is kept.
	nobody := asUser(42, "nobody", "sh", "-c", "echo entrypoint-quits")
	j := mustPrepare(t, p, opts(short, nobody.id, nobody.job))
	if !strings.Contains(j.prep.String(), "Entrypoint override disabled") {
		t.Errorf("no warning in the job log:\n%s", j.prep.String())
	}
	if out := j.mustRun("id -u"); strings.TrimSpace(out) != "65534" {
		t.Errorf("id -u = %q, want nobody's", out)
	}
	ids := buildContainers(cli, short)
	if len(ids) != 1 {
		t.Fatalf("build containers %v", ids)
	}
	ins, err := cli.ContainerInspect(ctx, ids[0])
	if err != nil || slices.Contains(ins.Config.Entrypoint, "echo entrypoint-quits") {
		t.Fatalf("entrypoint %v %v", ins.Config.Entrypoint, err)
	}
	// volume_keep: the anonymous temporary-directory volume outlives the
	// container (newProvider's cleanup removes it by label).
	var anon string
	for _, m := range ins.Mounts {
		if m.Destination == j.env.TmpDir {
			anon = m.Name
		}
	}
	if err := j.e.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.VolumeInspect(ctx, anon); anon == "" || err != nil {
		t.Errorf("volume_keep: temporary volume %q gone: %v", anon, err)
	}

	// enable_ipv6 reaches the per-job network: a daemon without an IPv6
	// pool refuses it, naming the key; one with a pool makes it.
	p6 := newProvider(t, cli, config.Docker{EnableIPv6: true}, short)
	e, _ := p6.Create(ctx)
	t.Cleanup(func() { _ = e.Cleanup(context.Background()) })
	_, err = e.Prepare(ctx, opts(short, 43, &runnerapi.JobResponse{Image: &runnerapi.Image{Name: busybox}}))
	if err != nil {
		if !strings.Contains(err.Error(), "docker.enable_ipv6") || !strings.Contains(strings.ToLower(err.Error()), "ipv6") {
			t.Fatalf("enable_ipv6: %v", err)
		}
		t.Logf("the daemon has no IPv6 pool: %v", err)
		return
	}
	nw, err := cli.NetworkInspect(ctx, e.(*Executor).j.netMode, network.InspectOptions{})
	if err != nil || !nw.EnableIPv6 {
		t.Errorf("per-job network without IPv6: %+v %v", nw, err)
	}
}

type executorOptsJob struct {
	id  int64
	job *runnerapi.JobResponse
}

func endpointMAC(ins container.InspectResponse, mac string) bool {
	if ins.NetworkSettings == nil {
		return false
	}
	for _, ep := range ins.NetworkSettings.Networks {
		if ep != nil && ep.MacAddress == mac {
			return true
		}
	}
	return false
}

func ptr[T any](v T) *T { return &v }
