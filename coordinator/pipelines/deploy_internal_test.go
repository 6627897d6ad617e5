package pipelines

import (
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/store"
)

// TestDeployedSince: a deployment counts as newer than the stop job when
// it finished later, or at the same instant by a newer job (a retry that
// finished within the store's time resolution of the stop job).
func TestDeployedSince(t *testing.T) {
	at := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	stop := &store.Job{ID: 5, FinishedAt: at}
	for _, c := range []struct {
		finished time.Time
		job      int64
		want     bool
	}{
		{at.Add(time.Second), 3, true},
		{at.Add(-time.Second), 9, false},
		{at, 9, true},  // the retried deploy, same instant
		{at, 3, false}, // the deploy the stop job stopped
	} {
		d := &store.Deployment{JobID: c.job, FinishedAt: c.finished}
		if got := deployedSince(d, stop); got != c.want {
			t.Errorf("deployment of job %d finished %v vs stop job 5 at %v: %v, want %v", c.job, c.finished, at, got, c.want)
		}
	}
}
