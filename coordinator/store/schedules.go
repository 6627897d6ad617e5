package store

import "time"

// PipelineSchedule is a project's pipeline schedule (GitLab's pipeline
// schedules): a pipeline on Ref at every minute Cron matches in
// CronTimezone, with Variables and Inputs, run with its owner's rights.
type PipelineSchedule struct {
	ID        int64
	ProjectID int64
	// Description names it (required, as in GitLab).
	Description string
	// Ref is a branch or tag name, or a full refs/heads/… or refs/tags/…
	// name.
	Ref string
	// Cron is a 5-field expression or a descriptor (internal/cron);
	// CronTimezone an IANA zone name ("UTC", "Europe/Berlin").
	Cron, CronTimezone string
	Active             bool
	// NextRunAt is the next minute it runs at; zero when Cron never
	// matches again.
	NextRunAt time.Time
	// OwnerID is the user whose access it runs with: 0 for the admin
	// token, which is no user.
	OwnerID   int64
	Variables []PipelineVariable
	Inputs    []ScheduleInput
	CreatedAt time.Time
	UpdatedAt time.Time
	// Version counts the writes of the schedule: UpdatePipelineSchedule
	// applies only to the version read, so a change made meanwhile (by a
	// request, or by the scheduler moving NextRunAt) is never lost.
	Version int64
	// LastPipelineID is the newest pipeline it created, 0 for none. Read
	// only.
	LastPipelineID int64
}

// ScheduleInput is a value for one of the pipeline's spec:inputs.
type ScheduleInput struct {
	Name  string `json:"name"`
	Value any    `json:"value"`
}
