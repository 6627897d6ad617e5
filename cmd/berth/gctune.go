package main

import "github.com/berthci/berth/internal/gctune"

// startGCTuner gives a long-running command the heap floor $BERTH_GC_HEAP_FLOOR sets (default
// 128 MiB; GOGC in the environment turns it off): docs/performance.md, "Garbage collection: a heap floor".
// Stop the tuner it returns (nil when off) when the command ends.
func startGCTuner() (*gctune.Tuner, error) {
	floor, err := gctune.FloorFromEnv()
	if err != nil {
		return nil, err
	}
	return gctune.Start(floor), nil
}
