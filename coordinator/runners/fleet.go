package runners

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/runnerapi"
)

// FleetWriteInterval: a runner manager's fleet report is written to the
// store at most this often (its manager sends one every 15 s); reports
// in between are dropped.
const FleetWriteInterval = 10 * time.Second

// ErrBadFleet: a fleet report that is not one.
var ErrBadFleet = errors.New("invalid fleet report")

// fleetWrites remembers when each manager's fleet was last written here.
type fleetWrites struct {
	mu   sync.Mutex
	last map[ManagerRef]time.Time
}

// ReportFleet records a runner manager's fleet report (Berth's PUT
// /api/v4/berth/runners/fleet) in the store, where every replica's web UI
// reads it: the manager's record is created or touched first, and a report
// coming sooner than FleetWriteInterval after the last one written by this
// replica is dropped. It reports whether the report was written.
func (r *Registry) ReportFleet(ctx context.Context, rn *store.Runner, f *runnerapi.Fleet) (bool, error) {
	if err := checkFleet(f); err != nil {
		return false, err
	}
	ref := ManagerRef{rn.ID, f.SystemID}
	now := r.clock.Now()
	r.fleets.mu.Lock()
	if last, ok := r.fleets.last[ref]; ok && now.Sub(last) < FleetWriteInterval {
		r.fleets.mu.Unlock()
		return false, nil
	}
	r.fleets.mu.Unlock()
	if _, err := r.TouchManager(ctx, rn, f.SystemID, nil); err != nil {
		return false, fmt.Errorf("touching manager %q: %w", f.SystemID, err)
	}
	b, err := json.Marshal(f)
	if err != nil {
		return false, err
	}
	if err := r.store.PutRunnerManagerFleet(ctx, rn.ID, f.SystemID, b, now.UTC()); err != nil {
		return false, err
	}
	r.fleets.mu.Lock()
	if r.fleets.last == nil {
		r.fleets.last = map[ManagerRef]time.Time{}
	}
	r.fleets.last[ref] = now
	r.fleets.mu.Unlock()
	return true, nil
}

// checkFleet refuses reports no manager sends: no system_id, negative
// counts or instance time.
func checkFleet(f *runnerapi.Fleet) error {
	switch {
	case f.SystemID == "" || len(f.SystemID) > 64:
		return fmt.Errorf("system_id: want 1 to 64 characters: %w", ErrBadFleet)
	case f.Creating < 0 || f.Booted < 0 || f.Ready < 0 || f.Removing < 0 || f.Deleting < 0 || f.MaxInstances < 0 ||
		f.Capacity < 0 || f.SlotsInUse < 0 || f.SlotsIdle < 0 || f.IdleInstances < 0 || f.Waiting < 0 ||
		f.Boots < 0 || f.Deletions < 0 || !(f.InstanceSeconds >= 0):
		return fmt.Errorf("counts must not be negative: %w", ErrBadFleet)
	case len(f.Executor) > 64 || len(f.Plugin) > 256:
		return fmt.Errorf("executor or plugin name too long: %w", ErrBadFleet)
	}
	return nil
}
