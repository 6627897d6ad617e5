// Package config holds the executors' sections of config.toml
// ([runners.docker], [runners.ssh], [runners.custom]) with GitLab's keys:
// plain structs the executors take as their configuration. Package
// runner/config decodes config.toml into them (its Docker, SSH and Custom
// are these types) and validates them with the rest of the file.
package config

import (
	"bytes"
	"fmt"
	"time"

	"github.com/BurntSushi/toml"
)

// StringList is a TOML value that may be a string or an array of strings
// (pull_policy = "always" and pull_policy = ["always", "if-not-present"]).
type StringList []string

// UnmarshalTOML implements toml.Unmarshaler.
func (l *StringList) UnmarshalTOML(v any) error {
	switch v := v.(type) {
	case string:
		*l = StringList{v}
	case []any:
		out := make(StringList, 0, len(v))
		for i, e := range v {
			s, ok := e.(string)
			if !ok {
				return fmt.Errorf("element %d: want a string, got %T", i, e)
			}
			out = append(out, s)
		}
		*l = out
	default:
		return fmt.Errorf("want a string or an array of strings, got %T", v)
	}
	return nil
}

// Docker is [runners.docker], with GitLab Runner's keys. Sizes are
// strings as GitLab writes them ("512m", "2g"); cpus is a decimal string.
type Docker struct {
	Host                   string            `toml:"host"`
	Image                  string            `toml:"image"`
	Privileged             bool              `toml:"privileged"`
	User                   string            `toml:"user"`
	Volumes                []string          `toml:"volumes"`
	CacheDir               string            `toml:"cache_dir"`
	DisableCache           bool              `toml:"disable_cache"`
	CPUs                   string            `toml:"cpus"`
	Memory                 string            `toml:"memory"`
	MemorySwap             string            `toml:"memory_swap"`
	ShmSize                int64             `toml:"shm_size"`
	DNS                    []string          `toml:"dns"`
	DNSSearch              []string          `toml:"dns_search"`
	ExtraHosts             []string          `toml:"extra_hosts"`
	NetworkMode            string            `toml:"network_mode"`
	PullPolicy             StringList        `toml:"pull_policy"`
	AllowedImages          []string          `toml:"allowed_images"`
	AllowedServices        []string          `toml:"allowed_services"`
	AllowedPullPolicies    []string          `toml:"allowed_pull_policies"`
	CapAdd                 []string          `toml:"cap_add"`
	CapDrop                []string          `toml:"cap_drop"`
	Devices                []string          `toml:"devices"`
	SecurityOpt            []string          `toml:"security_opt"`
	Tmpfs                  map[string]string `toml:"tmpfs"`
	ServicesTmpfs          map[string]string `toml:"services_tmpfs"`
	WaitForServicesTimeout int               `toml:"wait_for_services_timeout"`
	ServicesLimit          *int              `toml:"services_limit"`
	ContainerLabels        map[string]string `toml:"container_labels"`
	// CgroupParent and ServiceCgroupParent are the cgroup parents of the
	// build and service containers (--cgroup-parent); with slot cgroups
	// the slot's cgroup is used instead.
	CgroupParent        string `toml:"cgroup_parent"`
	ServiceCgroupParent string `toml:"service_cgroup_parent"`
	// ServiceSlotCgroupTemplate is the slot cgroup of service containers
	// (docker-autoscaler with use_slot_cgroups; default: the runner's
	// slot_cgroup_template).
	ServiceSlotCgroupTemplate string `toml:"service_slot_cgroup_template"`
	// HelperImage and HelperImageFlavor are accepted for compatibility:
	// Berth runs every stage in the job's container with the berth binary
	// mounted, so it needs no helper image (Load warns).
	HelperImage       string          `toml:"helper_image"`
	HelperImageFlavor string          `toml:"helper_image_flavor"`
	Services          []DockerService `toml:"services"`

	// The keys below are GitLab's, applied as gitlab-runner applies them;
	// docs/executor-docker.md says which container each one reaches.

	// Hostname is the build container's host name (default: one made of
	// the runner, project and slot).
	Hostname string `toml:"hostname"`
	// Runtime is the OCI runtime of the build and service containers.
	Runtime           string   `toml:"runtime"`
	CPUShares         int64    `toml:"cpu_shares"`
	CPUSetCPUs        string   `toml:"cpuset_cpus"`
	CPUSetMems        string   `toml:"cpuset_mems"`
	MemoryReservation string   `toml:"memory_reservation"`
	OomKillDisable    bool     `toml:"oom_kill_disable"`
	OomScoreAdjust    int      `toml:"oom_score_adjust"`
	GroupAdd          []string `toml:"group_add"`
	// UsernsMode applies to the build and service containers.
	UsernsMode string            `toml:"userns_mode"`
	PidMode    string            `toml:"pid_mode"`
	IpcMode    string            `toml:"ipcmode"`
	Sysctls    map[string]string `toml:"sysctls"`
	// Ulimit maps a limit's name to "SOFT[:HARD]" ("nofile" = "1024:2048").
	Ulimit            map[string]string `toml:"ulimit"`
	DeviceCgroupRules []string          `toml:"device_cgroup_rules"`
	Links             []string          `toml:"links"`
	MacAddress        string            `toml:"mac_address"`
	// LogOptions are options of the json-file log driver (env, labels)
	// of the build and service containers.
	LogOptions      map[string]string `toml:"log_options"`
	VolumesFrom     []string          `toml:"volumes_from"`
	VolumeDriver    string            `toml:"volume_driver"`
	VolumeDriverOps map[string]string `toml:"volume_driver_ops"`
	// VolumeKeep keeps the containers' anonymous volumes when Cleanup
	// removes the containers.
	VolumeKeep bool `toml:"volume_keep"`
	// NetworkMTU and EnableIPv6 apply to the per-job network (none is
	// created when network_mode is set).
	NetworkMTU int  `toml:"network_mtu"`
	EnableIPv6 bool `toml:"enable_ipv6"`
	// ServicesPrivileged is privileged for service containers (unset:
	// privileged).
	ServicesPrivileged  *bool    `toml:"services_privileged"`
	ServicesSecurityOpt []string `toml:"services_security_opt"`
	// ServicesDevices maps an image pattern to the devices of the service
	// containers whose image matches it.
	ServicesDevices          map[string][]string `toml:"services_devices"`
	ServiceCPUs              string              `toml:"service_cpus"`
	ServiceCPUShares         int64               `toml:"service_cpu_shares"`
	ServiceCPUSetCPUs        string              `toml:"service_cpuset_cpus"`
	ServiceMemory            string              `toml:"service_memory"`
	ServiceMemorySwap        string              `toml:"service_memory_swap"`
	ServiceMemoryReservation string              `toml:"service_memory_reservation"`
	// AllowedPrivilegedImages and AllowedPrivilegedServices are patterns
	// (as allowed_images) of the images that may run privileged when
	// privileged (services_privileged) is set; empty: all.
	AllowedPrivilegedImages   []string `toml:"allowed_privileged_images"`
	AllowedPrivilegedServices []string `toml:"allowed_privileged_services"`
	// AllowedUsers are the users the build container may run as (empty:
	// user, if set, else any).
	AllowedUsers []string `toml:"allowed_users"`
	// DisableEntrypointOverwrite ignores the entrypoints jobs and
	// [[runners.docker.services]] give: images run with their own.
	DisableEntrypointOverwrite bool `toml:"disable_entrypoint_overwrite"`
}

// DockerService is one [[runners.docker.services]] entry: a service every
// job of the runner gets.
type DockerService struct {
	Name       string   `toml:"name"`
	Alias      string   `toml:"alias"`
	Entrypoint []string `toml:"entrypoint"`
	Command    []string `toml:"command"`
	Variables  []string `toml:"environment"`
}

// DefaultWaitForServicesTimeout is wait_for_services_timeout's default.
const DefaultWaitForServicesTimeout = 30 * time.Second

// ServicesTimeout is wait_for_services_timeout: its default when 0, and 0
// (do not wait) when negative.
func (d *Docker) ServicesTimeout() time.Duration {
	switch {
	case d.WaitForServicesTimeout < 0:
		return 0
	case d.WaitForServicesTimeout == 0:
		return DefaultWaitForServicesTimeout
	}
	return time.Duration(d.WaitForServicesTimeout) * time.Second
}

// Pull policies.
const (
	PullAlways       = "always"
	PullIfNotPresent = "if-not-present"
	PullNever        = "never"
)

// SSH is [runners.ssh].
type SSH struct {
	Host     string `toml:"host"`
	Port     string `toml:"port"`
	User     string `toml:"user"`
	Password string `toml:"password"`
	// IdentityFile is a private key file (OpenSSH or PEM format).
	IdentityFile   string `toml:"identity_file"`
	KnownHostsFile string `toml:"known_hosts_file"`
	// DisableStrictHostKeyChecking accepts any host key. GitLab's default
	// is true for compatibility; Berth's is false: a host must be in
	// known_hosts_file (default ~/.ssh/known_hosts) unless this is set.
	DisableStrictHostKeyChecking *bool `toml:"disable_strict_host_key_checking"`
}

// Custom is [runners.custom]: GitLab's custom executor.
type Custom struct {
	ConfigExec          string   `toml:"config_exec"`
	ConfigArgs          []string `toml:"config_args"`
	ConfigExecTimeout   *int     `toml:"config_exec_timeout"`
	PrepareExec         string   `toml:"prepare_exec"`
	PrepareArgs         []string `toml:"prepare_args"`
	PrepareExecTimeout  *int     `toml:"prepare_exec_timeout"`
	RunExec             string   `toml:"run_exec"`
	RunArgs             []string `toml:"run_args"`
	CleanupExec         string   `toml:"cleanup_exec"`
	CleanupArgs         []string `toml:"cleanup_args"`
	CleanupExecTimeout  *int     `toml:"cleanup_exec_timeout"`
	GracefulKillTimeout *int     `toml:"graceful_kill_timeout"`
	ForceKillTimeout    *int     `toml:"force_kill_timeout"`
}

// Defaults of the custom executor's timeouts (GitLab's).
const (
	DefaultCustomExecTimeout   = time.Hour
	DefaultGracefulKillTimeout = 10 * time.Minute
	DefaultForceKillTimeout    = 10 * time.Minute
)

// Seconds turns an optional timeout key into a duration with its default.
func Seconds(v *int, def time.Duration) time.Duration {
	if v == nil || *v <= 0 {
		return def
	}
	return time.Duration(*v) * time.Second
}

// ValidPullPolicy reports whether p is always, if-not-present or never.
func ValidPullPolicy(p string) bool {
	return p == PullAlways || p == PullIfNotPresent || p == PullNever
}

// Plugin is [runners.plugin]: an executor served by a plugin process
// (executor = "plugin"), Berth's own section. Name or Path says which
// plugin; Config is handed to it as a JSON object.
type Plugin struct {
	// Name finds the plugin: berth-executor-<name> in PATH, then in the
	// executor plugin directory; a built-in executor's name (shell,
	// docker, ssh, custom) falls back to the berth binary itself.
	Name string `toml:"name"`
	// Path is the plugin program (instead of Name).
	Path string `toml:"path"`
	// Args are the program's arguments.
	Args []string `toml:"args"`
	// Config is [runners.plugin.config], passed to the plugin as is.
	Config map[string]any `toml:"config"`
	// StartTimeout bounds the plugin's start (handshake and Describe), in
	// seconds (default 30).
	StartTimeout int `toml:"start_timeout"`
}

// DefaultPluginStartTimeout is start_timeout's default.
const DefaultPluginStartTimeout = 30 * time.Second

// MicroVM is [runners.microvm]: jobs in VMs of a nesting daemon, one VM
// per job (executor = "microvm", Berth's own).
type MicroVM struct {
	// NestingHost is a running nesting daemon (unix:///path, a path, or
	// host:port); empty: the runner manager runs the QEMU hypervisor
	// itself.
	NestingHost string `toml:"nesting_host"`
	// NestingConfig is the hypervisor's configuration, sent to the daemon
	// as JSON in Init (see docs/nesting.md).
	NestingConfig map[string]any `toml:"nesting_config"`
	// Image is the VM image of jobs that name none.
	Image string `toml:"image"`
	// AllowedImages are patterns (path.Match, * for any) a job's image
	// must match; empty allows every image.
	AllowedImages []string `toml:"allowed_images"`
}

// VMIsolation is [runners.autoscaler.vm_isolation] (GitLab's): jobs of an
// instance executor run in a VM of the instance's nesting daemon, one per
// slot.
type VMIsolation struct {
	Enabled       bool           `toml:"enabled"`
	NestingHost   string         `toml:"nesting_host"`
	NestingConfig map[string]any `toml:"nesting_config"`
	Image         string         `toml:"image"`
	// ConnectorConfig is GitLab's way to reach the VM (SSH into it);
	// Berth reaches its agent through the instance's connector instead,
	// and accepts and ignores these keys.
	ConnectorConfig map[string]any `toml:"connector_config"`
}

// ParseVMIsolation reads [runners.autoscaler.vm_isolation] as the
// configuration keeps it (a table), refusing keys it does not know.
func ParseVMIsolation(m map[string]any) (VMIsolation, error) {
	var v VMIsolation
	if len(m) == 0 {
		return v, nil
	}
	var buf bytes.Buffer
	if err := toml.NewEncoder(&buf).Encode(m); err != nil {
		return v, fmt.Errorf("vm_isolation: %w", err)
	}
	md, err := toml.Decode(buf.String(), &v)
	if err != nil {
		return v, fmt.Errorf("vm_isolation: %w", err)
	}
	for _, k := range md.Undecoded() {
		if len(k) > 0 && (k[0] == "nesting_config" || k[0] == "connector_config") {
			continue
		}
		return v, fmt.Errorf("vm_isolation.%s: unknown key", k)
	}
	return v, nil
}
