package main

import (
	"testing"

	"github.com/berthci/berth/fleeting"
	"github.com/berthci/berth/fleeting/fleetingtest"
)

// TestConformanceOverGRPC runs the conformance suite against the plugin
// binary, through the host and real gRPC; the instances are server
// processes of the same binary.
func TestConformanceOverGRPC(t *testing.T) {
	bin := fleetingtest.BuildPlugin(t, "github.com/berthci/berth/cmd/fleeting-plugin-local")
	fleetingtest.Run(t, func(t *testing.T) fleeting.InstanceGroup {
		return fleetingtest.StartPlugin(t, bin, map[string]any{
			"state_dir":     t.TempDir(),
			"max_instances": 3,
		})
	})
}
