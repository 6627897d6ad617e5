package runner

import (
	"context"
	"errors"
	"time"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/runner/network"
)

// fleetInterval is how often a manager whose executor autoscales reports
// its fleet to the coordinator.
const fleetInterval = 15 * time.Second

// reportFleet sends w's fleet (executor.FleetReporter) to the coordinator
// every fleetInterval, and once more as it stops, until ctx ends. It stops
// where the coordinator takes no fleet reports (GitLab).
func (m *Manager) reportFleet(ctx context.Context, w *worker, fr executor.FleetReporter) {
	t := time.NewTicker(fleetInterval)
	defer t.Stop()
	send := func(ctx context.Context) bool {
		f := fr.Fleet()
		f.SystemID, f.Executor = m.systemID, w.rc.Executor
		err := m.client.ReportFleet(ctx, w.creds(), f)
		switch {
		case errors.Is(err, network.ErrNoFleetReports):
			m.log.Info("the coordinator takes no fleet reports", "runner", w.short)
			return false
		case err != nil && ctx.Err() == nil:
			m.log.Debug("reporting the fleet failed", "runner", w.short, "err", err)
		}
		return true
	}
	for {
		if !send(ctx) {
			return
		}
		select {
		case <-ctx.Done():
			// The last word: what the fleet holds as requests stop.
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			send(sctx)
			cancel()
			return
		case <-t.C:
		}
	}
}
