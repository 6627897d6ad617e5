package main

import (
	"testing"

	"github.com/berthci/berth/fleeting"
	"github.com/berthci/berth/fleeting/fleetingtest"
)

// TestConformanceOverGRPC runs the conformance suite against the plugin
// binary, through the host and real gRPC.
func TestConformanceOverGRPC(t *testing.T) {
	bin := fleetingtest.BuildPlugin(t, "github.com/berthci/berth/cmd/fleeting-plugin-static")
	fleetingtest.Run(t, func(t *testing.T) fleeting.InstanceGroup {
		return fleetingtest.StartPlugin(t, bin, map[string]any{
			"hosts": []map[string]any{
				{"id": "a", "address": "192.0.2.1:22"},
				{"id": "b", "address": "192.0.2.2:22"},
				{"id": "c", "address": "192.0.2.3:22"},
			},
		})
	})
}
