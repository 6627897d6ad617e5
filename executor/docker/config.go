package docker

import (
	"fmt"
	"maps"
	"math"
	"net"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/go-units"

	"github.com/berthci/berth/executor/config"
)

// settings are the [runners.docker] keys, checked and parsed once by New.
type settings struct {
	cfg config.Docker

	nanoCPUs            int64
	memory              int64
	memorySwap          int64
	volumes             []volumeSpec
	devices             []container.DeviceMapping
	pullPolicies        []string // never empty
	allowedPullPolicies []string // never empty
	allowedImages       []glob
	allowedServices     []glob
	servicesTimeout     time.Duration // 0: do not wait
	servicesLimit       int           // -1: unlimited

	memoryReservation         int64
	ulimits                   []*container.Ulimit
	logConfig                 container.LogConfig
	macAddress                string // normalized
	serviceNanoCPUs           int64
	serviceMemory             int64
	serviceMemorySwap         int64
	serviceMemoryReservation  int64
	servicesDevices           []imageDevices
	allowedPrivilegedImages   []glob
	allowedPrivilegedServices []glob
}

// imageDevices is one services_devices entry: the devices of the service
// containers whose image matches a pattern.
type imageDevices struct {
	image   glob
	devices []container.DeviceMapping
}

// volumeSpec is one entry of volumes.
type volumeSpec struct {
	// Target is the path inside the container.
	Target string
	// Source is a host path or a volume name ("" for a cache entry).
	Source string
	// Mode is the bind's options ("ro", "rw,z", …; "" for none).
	Mode string
}

// cache reports whether the entry is a bare "/path": a persistent
// per-project cache volume (or a host directory under cache_dir).
func (v volumeSpec) cache() bool { return v.Source == "" }

// bind is the entry as a HostConfig.Binds string.
func (v volumeSpec) bind() string {
	if v.Mode == "" {
		return v.Source + ":" + v.Target
	}
	return v.Source + ":" + v.Target + ":" + v.Mode
}

// parseSettings checks every key of d and names the key in any error.
func parseSettings(d config.Docker) (*settings, error) {
	s := &settings{cfg: d, servicesLimit: -1}
	var err error
	if d.Image != "" && !strings.Contains(d.Image, "$") {
		if _, err := parseImageName(d.Image); err != nil {
			return nil, fmt.Errorf("docker.image: %w", err)
		}
	}
	if d.CPUs != "" {
		if s.nanoCPUs, err = parseCPUs(d.CPUs); err != nil {
			return nil, fmt.Errorf("docker.cpus: %w", err)
		}
	}
	if d.Memory != "" {
		if s.memory, err = parseMemory(d.Memory, false); err != nil {
			return nil, fmt.Errorf("docker.memory: %w", err)
		}
	}
	if d.MemorySwap != "" {
		if s.memorySwap, err = parseMemory(d.MemorySwap, true); err != nil {
			return nil, fmt.Errorf("docker.memory_swap: %w", err)
		}
		if s.memory == 0 {
			return nil, fmt.Errorf("docker.memory_swap: needs docker.memory")
		}
		if s.memorySwap > 0 && s.memorySwap < s.memory {
			return nil, fmt.Errorf("docker.memory_swap: %q is less than docker.memory %q (it is memory plus swap)", d.MemorySwap, d.Memory)
		}
	}
	if d.CacheDir != "" {
		// A host directory, relative to the working directory as in GitLab.
		abs, err := filepath.Abs(d.CacheDir)
		if err != nil {
			return nil, fmt.Errorf("docker.cache_dir: %w", err)
		}
		s.cfg.CacheDir = abs
	}
	if d.ShmSize < 0 {
		return nil, fmt.Errorf("docker.shm_size: must not be negative")
	}
	seen := map[string]string{}
	for i, v := range d.Volumes {
		key := fmt.Sprintf("docker.volumes[%d]", i)
		vs, err := parseVolume(v)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", key, err)
		}
		if prev, ok := seen[vs.Target]; ok {
			return nil, fmt.Errorf("%s: container path %s is already mounted by %s", key, vs.Target, prev)
		}
		seen[vs.Target] = key
		s.volumes = append(s.volumes, vs)
	}
	for i, dev := range d.Devices {
		dm, err := parseDevice(dev)
		if err != nil {
			return nil, fmt.Errorf("docker.devices[%d]: %w", i, err)
		}
		s.devices = append(s.devices, dm)
	}
	for i, ip := range d.DNS {
		if net.ParseIP(strings.TrimSpace(ip)) == nil {
			return nil, fmt.Errorf("docker.dns[%d]: %q is not an IP address", i, ip)
		}
	}
	for i, h := range d.ExtraHosts {
		if err := checkExtraHost(h); err != nil {
			return nil, fmt.Errorf("docker.extra_hosts[%d]: %w", i, err)
		}
	}
	for k := range d.Tmpfs {
		if !path.IsAbs(k) {
			return nil, fmt.Errorf("docker.tmpfs: mount point %q is not an absolute path", k)
		}
	}
	for k := range d.ServicesTmpfs {
		if !path.IsAbs(k) {
			return nil, fmt.Errorf("docker.services_tmpfs: mount point %q is not an absolute path", k)
		}
	}
	if err := checkNetworkMode(d.NetworkMode); err != nil {
		return nil, fmt.Errorf("docker.network_mode: %w", err)
	}
	for i, p := range d.PullPolicy {
		if !validPullPolicy(p) {
			return nil, fmt.Errorf("docker.pull_policy[%d]: %q is not always, if-not-present or never", i, p)
		}
	}
	s.pullPolicies = append([]string(nil), d.PullPolicy...)
	if len(s.pullPolicies) == 0 {
		s.pullPolicies = []string{config.PullAlways}
	}
	for i, p := range d.AllowedPullPolicies {
		if !validPullPolicy(p) {
			return nil, fmt.Errorf("docker.allowed_pull_policies[%d]: %q is not always, if-not-present or never", i, p)
		}
	}
	s.allowedPullPolicies = append([]string(nil), d.AllowedPullPolicies...)
	if len(s.allowedPullPolicies) == 0 {
		s.allowedPullPolicies = s.pullPolicies
	}
	if s.allowedImages, err = compileGlobs("docker.allowed_images", d.AllowedImages); err != nil {
		return nil, err
	}
	if s.allowedServices, err = compileGlobs("docker.allowed_services", d.AllowedServices); err != nil {
		return nil, err
	}
	for i, sv := range d.Services {
		if strings.TrimSpace(sv.Name) == "" {
			return nil, fmt.Errorf("docker.services[%d].name: is required", i)
		}
		if !strings.Contains(sv.Name, "$") {
			if _, err := parseImageName(sv.Name); err != nil {
				return nil, fmt.Errorf("docker.services[%d].name: %w", i, err)
			}
		}
		for j, e := range sv.Variables {
			if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
				return nil, fmt.Errorf("docker.services[%d].environment[%d]: want KEY=VALUE, got %q", i, j, e)
			}
		}
	}
	for k := range d.ContainerLabels {
		if k == "" {
			return nil, fmt.Errorf("docker.container_labels: empty label name")
		}
	}
	s.servicesTimeout = d.ServicesTimeout()
	if d.ServicesLimit != nil && *d.ServicesLimit >= 0 {
		s.servicesLimit = *d.ServicesLimit
	}
	if err := s.parseContainerKeys(d); err != nil {
		return nil, err
	}
	if err := s.parseServiceKeys(d); err != nil {
		return nil, err
	}
	return s, nil
}

// parseContainerKeys checks the keys of the build container (and those
// it shares with the services).
func (s *settings) parseContainerKeys(d config.Docker) error {
	var err error
	if d.Hostname != "" && !validHostname(d.Hostname) {
		return fmt.Errorf("docker.hostname: %q is not a host name (letters, digits, - and ., at most 63 characters)", d.Hostname)
	}
	if d.Runtime != "" && strings.TrimSpace(d.Runtime) != d.Runtime {
		return fmt.Errorf("docker.runtime: %q is surrounded by spaces", d.Runtime)
	}
	if d.CPUShares < 0 {
		return fmt.Errorf("docker.cpu_shares: %d: must not be negative", d.CPUShares)
	}
	if err := checkCPUSet(d.CPUSetCPUs); err != nil {
		return fmt.Errorf("docker.cpuset_cpus: %w", err)
	}
	if err := checkCPUSet(d.CPUSetMems); err != nil {
		return fmt.Errorf("docker.cpuset_mems: %w", err)
	}
	if d.MemoryReservation != "" {
		if s.memoryReservation, err = parseMemory(d.MemoryReservation, false); err != nil {
			return fmt.Errorf("docker.memory_reservation: %w", err)
		}
		if s.memory > 0 && s.memoryReservation > s.memory {
			return fmt.Errorf("docker.memory_reservation: %q is more than docker.memory %q", d.MemoryReservation, d.Memory)
		}
	}
	if d.OomScoreAdjust < -1000 || d.OomScoreAdjust > 1000 {
		return fmt.Errorf("docker.oom_score_adjust: %d is not between -1000 and 1000", d.OomScoreAdjust)
	}
	for i, g := range d.GroupAdd {
		if strings.TrimSpace(g) == "" || strings.ContainsAny(g, " :") {
			return fmt.Errorf("docker.group_add[%d]: %q is not a group name or id", i, g)
		}
	}
	if !container.UsernsMode(d.UsernsMode).Valid() {
		return fmt.Errorf("docker.userns_mode: %q: want host (or nothing)", d.UsernsMode)
	}
	if m := container.PidMode(d.PidMode); !m.Valid() {
		return fmt.Errorf("docker.pid_mode: %q: want host or container:<name|id>", d.PidMode)
	}
	if m := container.IpcMode(d.IpcMode); !m.Valid() || (m.IsContainer() && m.Container() == "") {
		return fmt.Errorf("docker.ipcmode: %q: want none, private, shareable, host or container:<name|id>", d.IpcMode)
	}
	for k := range d.Sysctls {
		if !sysctlName.MatchString(k) {
			return fmt.Errorf("docker.sysctls: %q is not a sysctl name (like net.ipv4.ip_forward)", k)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(d.Ulimit)) {
		u, err := parseUlimit(name, d.Ulimit[name])
		if err != nil {
			return fmt.Errorf("docker.ulimit: %w", err)
		}
		s.ulimits = append(s.ulimits, u)
	}
	for i, r := range d.DeviceCgroupRules {
		if !deviceCgroupRule.MatchString(r) {
			return fmt.Errorf("docker.device_cgroup_rules[%d]: %q: want TYPE MAJOR:MINOR ACCESS (like \"c 1:3 mr\", type a, b or c, * for any number, access r, w and m)", i, r)
		}
	}
	for i, l := range d.Links {
		if err := checkLink(l); err != nil {
			return fmt.Errorf("docker.links[%d]: %w", i, err)
		}
	}
	if d.MacAddress != "" {
		hw, err := net.ParseMAC(d.MacAddress)
		if err != nil || len(hw) != 6 {
			return fmt.Errorf("docker.mac_address: %q is not a MAC address (like 92:d0:c6:0a:29:33)", d.MacAddress)
		}
		s.macAddress = hw.String()
	}
	if s.logConfig, err = logConfig(d.LogOptions); err != nil {
		return fmt.Errorf("docker.log_options: %w", err)
	}
	for i, v := range d.VolumesFrom {
		if err := checkVolumesFrom(v); err != nil {
			return fmt.Errorf("docker.volumes_from[%d]: %w", i, err)
		}
	}
	if d.VolumeDriver != "" && !volumeName.MatchString(d.VolumeDriver) {
		return fmt.Errorf("docker.volume_driver: %q is not a driver name", d.VolumeDriver)
	}
	for k := range d.VolumeDriverOps {
		if k == "" {
			return fmt.Errorf("docker.volume_driver_ops: empty option name")
		}
	}
	if d.NetworkMTU != 0 && (d.NetworkMTU < 68 || d.NetworkMTU > 65535) {
		return fmt.Errorf("docker.network_mtu: %d is not between 68 and 65535", d.NetworkMTU)
	}
	if s.allowedPrivilegedImages, err = compileGlobs("docker.allowed_privileged_images", d.AllowedPrivilegedImages); err != nil {
		return err
	}
	for i, u := range d.AllowedUsers {
		if strings.TrimSpace(u) == "" {
			return fmt.Errorf("docker.allowed_users[%d]: empty user", i)
		}
	}
	return nil
}

// parseServiceKeys checks the keys of the service containers alone.
func (s *settings) parseServiceKeys(d config.Docker) error {
	var err error
	if d.ServiceCPUs != "" {
		if s.serviceNanoCPUs, err = parseCPUs(d.ServiceCPUs); err != nil {
			return fmt.Errorf("docker.service_cpus: %w", err)
		}
	}
	if d.ServiceCPUShares < 0 {
		return fmt.Errorf("docker.service_cpu_shares: %d: must not be negative", d.ServiceCPUShares)
	}
	if err := checkCPUSet(d.ServiceCPUSetCPUs); err != nil {
		return fmt.Errorf("docker.service_cpuset_cpus: %w", err)
	}
	if d.ServiceMemory != "" {
		if s.serviceMemory, err = parseMemory(d.ServiceMemory, false); err != nil {
			return fmt.Errorf("docker.service_memory: %w", err)
		}
	}
	if d.ServiceMemorySwap != "" {
		if s.serviceMemorySwap, err = parseMemory(d.ServiceMemorySwap, true); err != nil {
			return fmt.Errorf("docker.service_memory_swap: %w", err)
		}
		if s.serviceMemory == 0 {
			return fmt.Errorf("docker.service_memory_swap: needs docker.service_memory")
		}
		if s.serviceMemorySwap > 0 && s.serviceMemorySwap < s.serviceMemory {
			return fmt.Errorf("docker.service_memory_swap: %q is less than docker.service_memory %q (it is memory plus swap)", d.ServiceMemorySwap, d.ServiceMemory)
		}
	}
	if d.ServiceMemoryReservation != "" {
		if s.serviceMemoryReservation, err = parseMemory(d.ServiceMemoryReservation, false); err != nil {
			return fmt.Errorf("docker.service_memory_reservation: %w", err)
		}
		if s.serviceMemory > 0 && s.serviceMemoryReservation > s.serviceMemory {
			return fmt.Errorf("docker.service_memory_reservation: %q is more than docker.service_memory %q", d.ServiceMemoryReservation, d.ServiceMemory)
		}
	}
	for _, pattern := range slices.Sorted(maps.Keys(d.ServicesDevices)) {
		g, err := compileGlob(pattern)
		if err != nil {
			return fmt.Errorf("docker.services_devices[%q]: %w", pattern, err)
		}
		entry := imageDevices{image: g}
		for i, dev := range d.ServicesDevices[pattern] {
			dm, err := parseDevice(dev)
			if err != nil {
				return fmt.Errorf("docker.services_devices[%q][%d]: %w", pattern, i, err)
			}
			entry.devices = append(entry.devices, dm)
		}
		s.servicesDevices = append(s.servicesDevices, entry)
	}
	if s.allowedPrivilegedServices, err = compileGlobs("docker.allowed_privileged_services", d.AllowedPrivilegedServices); err != nil {
		return err
	}
	return nil
}

// compileGlobs compiles the patterns of the list key.
func compileGlobs(key string, patterns []string) ([]glob, error) {
	var out []glob
	for i, p := range patterns {
		g, err := compileGlob(p)
		if err != nil {
			return nil, fmt.Errorf("%s[%d]: %w", key, i, err)
		}
		out = append(out, g)
	}
	return out, nil
}

var (
	hostnameRE       = regexp.MustCompile(`^[a-zA-Z0-9]([a-zA-Z0-9.-]*[a-zA-Z0-9])?$`)
	sysctlName       = regexp.MustCompile(`^[a-zA-Z0-9_]+([./][a-zA-Z0-9_*-]+)+$`)
	deviceCgroupRule = regexp.MustCompile(`^[acb] ([0-9]+|\*):([0-9]+|\*) [rwm]{1,3}$`)
	cpuSetRE         = regexp.MustCompile(`^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$`)
)

func validHostname(h string) bool {
	return len(h) <= 63 && hostnameRE.MatchString(h)
}

// checkCPUSet checks a cpuset list ("0-3,5"), as Docker parses it.
func checkCPUSet(v string) error {
	if v == "" {
		return nil
	}
	if !cpuSetRE.MatchString(v) {
		return fmt.Errorf("%q: want a list of numbers and ranges (like 0-3,5)", v)
	}
	for _, part := range strings.Split(v, ",") {
		lo, hi, ok := strings.Cut(part, "-")
		if !ok {
			continue
		}
		l, err1 := strconv.Atoi(lo)
		h, err2 := strconv.Atoi(hi)
		if err1 != nil || err2 != nil || h < l {
			return fmt.Errorf("%q: range %q is not ascending", v, part)
		}
	}
	return nil
}

// parseUlimit parses one ulimit entry: "SOFT[:HARD]" (HARD defaults to
// SOFT), as gitlab-runner and docker run --ulimit read it.
func parseUlimit(name, v string) (*container.Ulimit, error) {
	soft, hard, hasHard := strings.Cut(strings.TrimSpace(v), ":")
	s, err := strconv.ParseInt(soft, 10, 64)
	h := s
	if err == nil && hasHard {
		h, err = strconv.ParseInt(hard, 10, 64)
	}
	if err != nil {
		return nil, fmt.Errorf("%q: want SOFT[:HARD], got %q", name, v)
	}
	// go-units knows the limits' names and checks soft <= hard.
	u, err := units.ParseUlimit(fmt.Sprintf("%s=%d:%d", name, s, h))
	if err != nil {
		return nil, fmt.Errorf("%q: %w", name, err)
	}
	return u, nil
}

// logConfig is the containers' log configuration: GitLab's, the json-file
// driver with only its env and labels options allowed.
func logConfig(opts map[string]string) (container.LogConfig, error) {
	lc := container.LogConfig{Type: "json-file"}
	for _, k := range slices.Sorted(maps.Keys(opts)) {
		if k != "env" && k != "labels" {
			return lc, fmt.Errorf("option %q is not allowed (only env and labels, options of the json-file log driver)", k)
		}
	}
	if len(opts) > 0 {
		lc.Config = opts
	}
	return lc, nil
}

// checkLink checks "name[:alias]" as docker run --link does.
func checkLink(l string) error {
	parts := strings.Split(l, ":")
	name := strings.TrimPrefix(parts[0], "/")
	switch {
	case len(parts) > 2:
		return fmt.Errorf("%q: want container[:alias]", l)
	case name == "" || !volumeName.MatchString(name):
		return fmt.Errorf("%q: %q is not a container name", l, parts[0])
	case len(parts) == 2 && (parts[1] == "" || !volumeName.MatchString(parts[1])):
		return fmt.Errorf("%q: %q is not an alias", l, parts[1])
	}
	return nil
}

// checkVolumesFrom checks "container[:ro|rw]".
func checkVolumesFrom(v string) error {
	name, mode, hasMode := strings.Cut(v, ":")
	if name == "" || !volumeName.MatchString(name) {
		return fmt.Errorf("%q: %q is not a container name", v, name)
	}
	if hasMode && mode != "ro" && mode != "rw" {
		return fmt.Errorf("%q: access %q is neither ro nor rw", v, mode)
	}
	return nil
}

// parseCPUs parses cpus ("1.5") as nano CPUs.
func parseCPUs(v string) (int64, error) {
	f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("%q is not a decimal number of CPUs", v)
	}
	if f <= 0 {
		return 0, fmt.Errorf("%q: must be more than 0", v)
	}
	n := int64(math.Round(f * 1e9))
	if n < 1e7 {
		return 0, fmt.Errorf("%q: must be at least 0.01", v)
	}
	return n, nil
}

// parseMemory parses a size as GitLab writes it ("512m", "2g", "1073741824");
// swap allows "-1" (unlimited swap).
func parseMemory(v string, swap bool) (int64, error) {
	v = strings.TrimSpace(v)
	if swap && v == "-1" {
		return -1, nil
	}
	n, err := units.RAMInBytes(v)
	if err != nil {
		return 0, fmt.Errorf("%q is not a size (like 512m or 2g)", v)
	}
	if n <= 0 {
		return 0, fmt.Errorf("%q: must be more than 0", v)
	}
	if n < 6<<20 {
		return 0, fmt.Errorf("%q: Docker needs at least 6m", v)
	}
	return n, nil
}

var volumeName = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`)

var bindModes = map[string]bool{
	"ro": true, "rw": true, "z": true, "Z": true, "nocopy": true,
	"shared": true, "rshared": true, "slave": true, "rslave": true, "private": true, "rprivate": true,
	"consistent": true, "cached": true, "delegated": true,
}

// parseVolume parses a volumes entry: "/path" (a persistent cache volume),
// "host-path:/path[:mode]" (a bind) or "volume-name:/path[:mode]".
func parseVolume(v string) (volumeSpec, error) {
	v = strings.TrimSpace(v)
	parts := strings.Split(v, ":")
	var vs volumeSpec
	switch len(parts) {
	case 1:
		vs.Target = parts[0]
	case 2:
		vs.Source, vs.Target = parts[0], parts[1]
	case 3:
		vs.Source, vs.Target, vs.Mode = parts[0], parts[1], parts[2]
	default:
		return vs, fmt.Errorf("%q: want /path, host:container or host:container:mode", v)
	}
	if vs.Target == "" || !path.IsAbs(vs.Target) {
		return vs, fmt.Errorf("%q: container path %q is not absolute", v, vs.Target)
	}
	vs.Target = path.Clean(vs.Target)
	if vs.Target == "/" {
		return vs, fmt.Errorf("%q: cannot mount over /", v)
	}
	if len(parts) > 1 {
		if vs.Source == "" {
			return vs, fmt.Errorf("%q: empty host path", v)
		}
		if !path.IsAbs(vs.Source) && !volumeName.MatchString(vs.Source) {
			return vs, fmt.Errorf("%q: %q is neither an absolute host path nor a volume name", v, vs.Source)
		}
	}
	if len(parts) == 3 {
		if vs.Mode == "" {
			return vs, fmt.Errorf("%q: empty mode", v)
		}
		for _, m := range strings.Split(vs.Mode, ",") {
			if !bindModes[m] {
				return vs, fmt.Errorf("%q: unknown mode %q (ro, rw, z, Z, nocopy, [r]shared, [r]slave, [r]private)", v, m)
			}
		}
	}
	return vs, nil
}

// parseDevice parses "host[:container[:permissions]]" as docker run
// --device does.
func parseDevice(v string) (container.DeviceMapping, error) {
	parts := strings.Split(strings.TrimSpace(v), ":")
	dm := container.DeviceMapping{CgroupPermissions: "rwm"}
	switch len(parts) {
	case 1:
		dm.PathOnHost = parts[0]
	case 2:
		dm.PathOnHost = parts[0]
		if isPerm(parts[1]) {
			dm.CgroupPermissions = parts[1]
		} else {
			dm.PathInContainer = parts[1]
		}
	case 3:
		dm.PathOnHost, dm.PathInContainer, dm.CgroupPermissions = parts[0], parts[1], parts[2]
		if !isPerm(dm.CgroupPermissions) {
			return dm, fmt.Errorf("%q: permissions %q are not a combination of r, w and m", v, dm.CgroupPermissions)
		}
	default:
		return dm, fmt.Errorf("%q: want host[:container[:permissions]]", v)
	}
	if !path.IsAbs(dm.PathOnHost) {
		return dm, fmt.Errorf("%q: host path %q is not absolute", v, dm.PathOnHost)
	}
	if dm.PathInContainer == "" {
		dm.PathInContainer = dm.PathOnHost
	}
	if !path.IsAbs(dm.PathInContainer) {
		return dm, fmt.Errorf("%q: container path %q is not absolute", v, dm.PathInContainer)
	}
	return dm, nil
}

func isPerm(s string) bool {
	if s == "" || len(s) > 3 {
		return false
	}
	for _, r := range s {
		if r != 'r' && r != 'w' && r != 'm' {
			return false
		}
	}
	return true
}

// checkExtraHost checks "name:ip" (ip may be host-gateway).
func checkExtraHost(h string) error {
	name, ip, ok := strings.Cut(h, ":")
	if !ok || name == "" || ip == "" {
		return fmt.Errorf("%q: want host:ip", h)
	}
	if ip != "host-gateway" && net.ParseIP(ip) == nil {
		return fmt.Errorf("%q: %q is not an IP address (or host-gateway)", h, ip)
	}
	return nil
}

// checkNetworkMode checks network_mode: empty (a network per job), bridge,
// host, none, container:<name|id> or the name of an existing network.
func checkNetworkMode(m string) error {
	if m == "" {
		return nil
	}
	if strings.HasPrefix(m, "container:") {
		if strings.TrimPrefix(m, "container:") == "" {
			return fmt.Errorf("%q: container: needs a container name or id", m)
		}
		return nil
	}
	if !volumeName.MatchString(m) {
		return fmt.Errorf("%q is not a network name", m)
	}
	return nil
}

func validPullPolicy(p string) bool {
	return p == config.PullAlways || p == config.PullIfNotPresent || p == config.PullNever
}
