package main

import (
	"testing"

	"github.com/berthci/berth/fleeting"
	"github.com/berthci/berth/fleeting/fleetingtest"
)

// TestConformanceOverGRPC runs the conformance suite against the plugin
// binary, through the host and real gRPC.
func TestConformanceOverGRPC(t *testing.T) {
	bin := fleetingtest.BuildPlugin(t, "github.com/berthci/berth/cmd/fleeting-plugin-fake")
	fleetingtest.Run(t, func(t *testing.T) fleeting.InstanceGroup {
		return fleetingtest.StartPlugin(t, bin, map[string]any{
			"seed":           1,
			"max_size":       4,
			"boot_latency":   map[string]any{"kind": "uniform", "min": "1ms", "max": "20ms"},
			"delete_latency": map[string]any{"value": "10ms"},
		})
	})
}
