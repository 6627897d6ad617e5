package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/executor/autoscaler"
	econfig "github.com/berthci/berth/executor/config"
	"github.com/berthci/berth/executor/dockerautoscaler"
	"github.com/berthci/berth/executor/instance"
	"github.com/berthci/berth/executor/microvm"
	"github.com/berthci/berth/executor/slotcgroup"
	"github.com/berthci/berth/fleeting/connector"
	"github.com/berthci/berth/fleeting/host"
	"github.com/berthci/berth/runner/config"
	"github.com/berthci/berth/token"
)

// pluginStartTimeout bounds a fleeting plugin's start and first Update.
const pluginStartTimeout = 2 * time.Minute

// newAutoscaledProvider builds the provider of an instance or
// docker-autoscaler [[runners]] entry: its fleeting plugin, taskscaler,
// and what runs jobs on the instances.
func newAutoscaledProvider(ctx context.Context, rc *config.Runner, log *slog.Logger) (executor.Provider, error) {
	if rc.Autoscaler == nil {
		return nil, errors.New("[runners.autoscaler] is required")
	}
	cfg := *rc.Autoscaler
	log = log.With("runner", rc.Name)
	sc := slotcgroup.Config{Enabled: rc.UseSlotCgroups, Template: rc.SlotCgroupTemplate}
	if rc.SlotCgroup != nil {
		sc.Limits = *rc.SlotCgroup
	}
	copts := connector.Options{UseExternalAddr: cfg.ConnectorConfig.UseExternalAddr}
	var inst autoscaler.Instances
	switch rc.Executor {
	case instance.Name:
		vi, err := econfig.ParseVMIsolation(cfg.VMIsolation)
		if err != nil {
			return nil, err
		}
		if vi.Enabled {
			x, err := microvm.NewInstances(microvm.InstancesOptions{Config: vi, Connector: copts, Logger: log})
			if err != nil {
				return nil, err
			}
			inst = x
			break
		}
		x, err := instance.New(instance.Options{Connector: copts, SlotCgroups: sc, Logger: log})
		if err != nil {
			return nil, err
		}
		inst = x
	case dockerautoscaler.Name:
		var d econfig.Docker
		if rc.Docker != nil {
			d = *rc.Docker
		}
		sc.Services = d.ServiceSlotCgroupTemplate
		x, err := dockerautoscaler.New(dockerautoscaler.Options{Config: d, Connector: copts, SlotCgroups: sc, Logger: log})
		if err != nil {
			return nil, err
		}
		inst = x
	default:
		return nil, fmt.Errorf("executor %q is not autoscaled", rc.Executor)
	}
	pcfg, err := json.Marshal(cfg.PluginConfig)
	if err != nil {
		return nil, fmt.Errorf("runners.autoscaler.plugin_config: %w", err)
	}
	if cfg.PluginConfig == nil {
		pcfg = []byte("{}")
	}
	ctx, cancel := context.WithTimeout(ctx, pluginStartTimeout)
	defer cancel()
	group, err := host.Start(ctx, host.Config{Plugin: cfg.Plugin, PluginConfig: pcfg, Builtin: builtinFleetingPlugin,
		Logger: log.With("component", "fleeting")})
	if err != nil {
		return nil, err
	}
	p, err := autoscaler.New(ctx, autoscaler.Options{
		Config: cfg, Group: group, Instances: inst, Name: token.Short(rc.Token), Connector: copts, Logger: log,
	})
	if err != nil {
		return nil, fmt.Errorf("starting the autoscaler: %w", err)
	}
	return p, nil
}
