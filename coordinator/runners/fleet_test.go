package runners_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/berthci/berth/coordinator/runners"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/runnerapi"
)

// A fleet report is stored on its runner manager (created if new), at
// most once per FleetWriteInterval; a report that is not one is refused.
func TestReportFleet(t *testing.T) {
	f := newFixture(t, 0)
	ctx := context.Background()
	f.create(t, &store.Runner{Type: store.InstanceType, RunUntagged: true})
	rns, _ := f.st.ListRunners(ctx)
	rn := rns[0]
	report := func(ready int) bool {
		t.Helper()
		wrote, err := f.reg.ReportFleet(ctx, rn, &runnerapi.Fleet{SystemID: "s_a", Ready: ready, Capacity: 2})
		if err != nil {
			t.Fatal(err)
		}
		return wrote
	}
	stored := func() runnerapi.Fleet {
		t.Helper()
		ms, err := f.st.ListRunnerManagers(ctx, rn.ID)
		if err != nil || len(ms) != 1 {
			t.Fatalf("managers %v %v", ms, err)
		}
		var fl runnerapi.Fleet
		if err := json.Unmarshal(ms[0].Fleet, &fl); err != nil {
			t.Fatal(err)
		}
		return fl
	}
	if !report(1) || stored().Ready != 1 {
		t.Fatal("first report not stored")
	}
	f.clock.Advance(runners.FleetWriteInterval / 2)
	if report(2) || stored().Ready != 1 {
		t.Error("a report sooner than the interval was written")
	}
	f.clock.Advance(runners.FleetWriteInterval)
	if !report(3) || stored().Ready != 3 {
		t.Error("a report after the interval was not written")
	}
	for _, bad := range []runnerapi.Fleet{{}, {SystemID: "s", SlotsInUse: -1}, {SystemID: "s", InstanceSeconds: -1}} {
		if _, err := f.reg.ReportFleet(ctx, rn, &bad); !errors.Is(err, runners.ErrBadFleet) {
			t.Errorf("report %+v: %v, want ErrBadFleet", bad, err)
		}
	}
}
