package slotcgroup

import (
	"fmt"
	"log/slog"
	"strings"
)

// Config is a runner's slot cgroup settings: use_slot_cgroups,
// slot_cgroup_template, [runners.docker] service_slot_cgroup_template and
// Berth's [runners.slot_cgroup] limits.
type Config struct {
	Enabled bool
	// Template names a slot's cgroup ("" is DefaultTemplate).
	Template string
	// Services names the cgroup of a slot's service containers ("": the
	// slot's own).
	Services string
	Limits   Limits
}

// SlotTemplate is Template with its default.
func (c Config) SlotTemplate() string {
	if c.Template == "" {
		return DefaultTemplate
	}
	return c.Template
}

// ServiceTemplate is the template of service containers' cgroups.
func (c Config) ServiceTemplate() string {
	if c.Services == "" {
		return c.SlotTemplate()
	}
	return c.Services
}

// Check validates an enabled configuration and warns, as GitLab does,
// about a template without ${slot} (every slot shares one cgroup).
func (c Config) Check(log *slog.Logger) error {
	if !c.Enabled {
		return nil
	}
	for _, t := range []struct{ key, tmpl string }{{"slot_cgroup_template", c.SlotTemplate()}, {"service_slot_cgroup_template", c.ServiceTemplate()}} {
		if _, err := Expand(t.tmpl, 0); err != nil {
			return fmt.Errorf("%s: %w", t.key, err)
		}
		if !HasPlaceholder(t.tmpl) && log != nil {
			log.Warn(t.key+" has no ${slot}: every slot shares one cgroup", "template", t.tmpl)
		}
	}
	if err := c.Limits.Validate(); err != nil {
		return fmt.Errorf("slot_cgroup: %w", err)
	}
	return nil
}

// Describe names a slot cgroup and its limits for a job log:
// "slot cgroup gitlab-runner/slot-1 (cpus 1.5, memory 512m, pids 256)".
func (c Config) Describe(path string) string {
	var lim []string
	if c.Limits.CPUs != "" {
		lim = append(lim, "cpus "+c.Limits.CPUs)
	}
	if c.Limits.Memory != "" {
		lim = append(lim, "memory "+c.Limits.Memory)
	}
	if c.Limits.Pids > 0 {
		lim = append(lim, fmt.Sprintf("pids %d", c.Limits.Pids))
	}
	if len(lim) == 0 {
		return "slot cgroup " + path
	}
	return "slot cgroup " + path + " (" + strings.Join(lim, ", ") + ")"
}
