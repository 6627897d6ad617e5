package runners

import (
	"time"

	"github.com/berthci/berth/coordinator/store"
)

// A runner's status, as GitLab's API and UI name it.
const (
	StatusOnline         = "online"
	StatusOffline        = "offline"
	StatusPaused         = "paused"
	StatusNeverContacted = "never_contacted"
)

// Status is what a runner's status is and when it was last heard from.
type Status struct {
	Status string
	// ContactedAt is the latest contact of the runner or any of its
	// managers (zero: never).
	ContactedAt time.Time
	Online      bool
}

// StatusOf tells a runner's status at now from its last contact and its
// managers': online when heard from within OnlineWindow, paused when
// paused (whatever the contact), else offline, or never_contacted.
func StatusOf(rn *store.Runner, managers []*store.RunnerManager, now time.Time) Status {
	contacted := rn.ContactedAt
	for _, m := range managers {
		if m.ContactedAt.After(contacted) {
			contacted = m.ContactedAt
		}
	}
	st := Status{ContactedAt: contacted, Online: !contacted.IsZero() && now.Sub(contacted) < OnlineWindow}
	switch {
	case rn.Paused:
		st.Status = StatusPaused
	case st.Online:
		st.Status = StatusOnline
	case !contacted.IsZero():
		st.Status = StatusOffline
	default:
		st.Status = StatusNeverContacted
	}
	return st
}
