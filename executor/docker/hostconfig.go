package docker

import (
	"slices"
	"strconv"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/api/types/versions"
)

// This file maps the [runners.docker] keys onto the containers the way
// gitlab-runner does (executors/docker/docker.go, createHostConfig and
// createHostConfigForService): which key reaches the build container,
// which the services, which both.

// applyBuild sets the build container's keys on hc: the container of
// image (the job's image, variables expanded).
func (s *settings) applyBuild(hc *container.HostConfig, image string) {
	c := s.cfg
	hc.Privileged = c.Privileged && allowed(s.allowedPrivilegedImages, image)
	hc.Runtime = c.Runtime
	hc.GroupAdd = c.GroupAdd
	hc.UsernsMode = container.UsernsMode(c.UsernsMode)
	hc.PidMode = container.PidMode(c.PidMode)
	hc.IpcMode = container.IpcMode(c.IpcMode)
	hc.Links = c.Links
	hc.OomScoreAdj = c.OomScoreAdjust
	hc.VolumeDriver = c.VolumeDriver
	hc.VolumesFrom = c.VolumesFrom
	hc.LogConfig = s.logConfig
	hc.Sysctls = c.Sysctls
	r := &hc.Resources
	r.MemoryReservation = s.memoryReservation
	r.CpusetCpus = c.CPUSetCPUs
	r.CpusetMems = c.CPUSetMems
	r.CPUShares = c.CPUShares
	if c.OomKillDisable {
		yes := true
		r.OomKillDisable = &yes
	}
	r.DeviceCgroupRules = c.DeviceCgroupRules
	r.Ulimits = s.ulimits
}

// applyService sets a service container's keys on hc: the service of
// image (variables expanded).
func (s *settings) applyService(hc *container.HostConfig, image string) {
	c := s.cfg
	privileged := c.Privileged
	if c.ServicesPrivileged != nil {
		privileged = *c.ServicesPrivileged
	}
	hc.Privileged = privileged && allowed(s.allowedPrivilegedServices, image)
	hc.SecurityOpt = c.ServicesSecurityOpt
	hc.Runtime = c.Runtime
	hc.UsernsMode = container.UsernsMode(c.UsernsMode)
	hc.LogConfig = s.logConfig
	r := &hc.Resources
	r.NanoCPUs = s.serviceNanoCPUs
	r.Memory = s.serviceMemory
	r.MemorySwap = s.serviceMemorySwap
	r.MemoryReservation = s.serviceMemoryReservation
	r.CpusetCpus = c.ServiceCPUSetCPUs
	r.CPUShares = c.ServiceCPUShares
	r.Devices = s.serviceDevices(image)
}

// serviceDevices are the services_devices of the patterns image matches.
func (s *settings) serviceDevices(image string) []container.DeviceMapping {
	var out []container.DeviceMapping
	for _, e := range s.servicesDevices {
		if e.image.match(image) {
			out = append(out, e.devices...)
		}
	}
	return out
}

// applyMAC sets mac_address on the build container: on its endpoint from
// API 1.44 on, else container-wide (the field older engines read), as
// docker run does. gitlab-runner only does the former and ignores the key,
// with a warning, on older engines.
func (s *settings) applyMAC(apiVersion string, cfg *container.Config, nc **network.NetworkingConfig, netMode string) {
	if s.macAddress == "" {
		return
	}
	if versions.LessThan(apiVersion, "1.44") {
		cfg.MacAddress = s.macAddress //nolint:staticcheck // the field of API < 1.44
		return
	}
	if *nc == nil {
		*nc = &network.NetworkingConfig{}
	}
	if (*nc).EndpointsConfig == nil {
		(*nc).EndpointsConfig = map[string]*network.EndpointSettings{}
	}
	key := netMode
	if key == "" {
		key = network.NetworkDefault
	}
	ep := (*nc).EndpointsConfig[key]
	if ep == nil {
		ep = &network.EndpointSettings{}
		(*nc).EndpointsConfig[key] = ep
	}
	ep.MacAddress = s.macAddress
}

// allowedUsers are the users the build container may run as, as
// gitlab-runner decides: allowed_users, else user when it is set (nil:
// any). The image's own user ("") is always allowed.
func (s *settings) allowedUsers() []string {
	if len(s.cfg.AllowedUsers) > 0 {
		return s.cfg.AllowedUsers
	}
	if s.cfg.User != "" {
		return []string{s.cfg.User}
	}
	return nil
}

// allowedUser reports whether the build container may run as user.
func (s *settings) allowedUser(user string) bool {
	list := s.allowedUsers()
	return user == "" || list == nil || slices.Contains(list, user)
}

// networkOptions are the options of the per-job network: network_mtu
// and enable_ipv6, as gitlab-runner sets them on its per-build network.
func (s *settings) networkOptions(labels map[string]string) network.CreateOptions {
	o := network.CreateOptions{Driver: "bridge", Labels: labels}
	if s.cfg.NetworkMTU != 0 {
		o.Options = map[string]string{"com.docker.network.driver.mtu": strconv.Itoa(s.cfg.NetworkMTU)}
	}
	if s.cfg.EnableIPv6 {
		yes := true
		o.EnableIPv6 = &yes
	}
	return o
}

// anonymousVolume are the options of a volume Docker creates with the
// container (the temporary directory; cache directories with
// disable_cache): volume_driver and volume_driver_ops, as on the volumes
// Berth creates.
func (s *settings) anonymousVolume(labels map[string]string) *mount.VolumeOptions {
	o := &mount.VolumeOptions{Labels: labels}
	if s.cfg.VolumeDriver != "" || len(s.cfg.VolumeDriverOps) > 0 {
		o.DriverConfig = &mount.Driver{Name: s.cfg.VolumeDriver, Options: s.cfg.VolumeDriverOps}
	}
	return o
}
