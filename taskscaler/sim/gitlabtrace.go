package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"time"
)

// apiJob is what a trace takes from a job of GitLab's jobs API
// (GET /projects/:id/jobs, which Berth's coordinator serves too).
type apiJob struct {
	ID             int64      `json:"id"`
	StartedAt      *time.Time `json:"started_at"`
	FinishedAt     *time.Time `json:"finished_at"`
	Duration       *float64   `json:"duration"`
	QueuedDuration *float64   `json:"queued_duration"`
	TagList        []string   `json:"tag_list"`
}

// parseAPITrace reads jobs as GitLab's jobs API returns them: JSON arrays
// of jobs (the API's pages, one after another), or one job object per
// value (JSON Lines). A job arrives when it was queued (started_at minus
// queued_duration; started_at where GitLab gives no queued_duration) and
// lasts duration (finished_at minus started_at where duration is null).
// Jobs that never started, or have not finished, are left out. Times
// count from the Monday 00:00 UTC on or before the first arrival, so
// that days and hours keep their weekday and time of day.
func parseAPITrace(r io.Reader, first byte) (Trace, error) {
	dec := json.NewDecoder(r)
	var (
		arrivals []time.Time
		jobs     []Job
		n        int // jobs read, for messages
		leftOut  int
	)
	add := func(j apiJob) error {
		n++
		where := func() string { // for an error only
			if j.ID != 0 {
				return fmt.Sprintf("job %d (id %d)", n, j.ID)
			}
			return fmt.Sprintf("job %d", n)
		}
		if j.StartedAt == nil {
			leftOut++ // never ran: created, skipped, manual, canceled while pending
			return nil
		}
		var d float64
		switch {
		case j.Duration != nil:
			d = *j.Duration
		case j.FinishedAt != nil:
			d = j.FinishedAt.Sub(*j.StartedAt).Seconds()
		default:
			leftOut++ // still running
			return nil
		}
		if !(d >= 0 && d <= maxSeconds) {
			return fmt.Errorf("%w: %s: duration %v is outside 0 to %d seconds", ErrTrace, where(), d, maxSeconds)
		}
		at := *j.StartedAt
		if q := j.QueuedDuration; q != nil {
			if !(*q >= 0 && *q <= maxSeconds) {
				return fmt.Errorf("%w: %s: queued_duration %v is outside 0 to %d seconds", ErrTrace, where(), *q, maxSeconds)
			}
			at = at.Add(-time.Duration(*q * float64(time.Second)))
		}
		arrivals = append(arrivals, at)
		jobs = append(jobs, Job{Duration: time.Duration(d * float64(time.Second)), Tags: strings.Join(j.TagList, ",")})
		return nil
	}
	bad := func(err error) error {
		return fmt.Errorf("%w: GitLab jobs JSON near byte %d (after job %d): %v", ErrTrace, dec.InputOffset(), n, err)
	}
	for {
		if first == '{' {
			var j apiJob
			if err := dec.Decode(&j); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				return Trace{}, bad(err)
			}
			if err := add(j); err != nil {
				return Trace{}, err
			}
			continue
		}
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return Trace{}, bad(err)
		}
		if tok != json.Delim('[') {
			return Trace{}, bad(fmt.Errorf("want an array of jobs, got %v", tok))
		}
		for dec.More() {
			var j apiJob
			if err := dec.Decode(&j); err != nil {
				return Trace{}, bad(err)
			}
			if err := add(j); err != nil {
				return Trace{}, err
			}
		}
		if _, err := dec.Token(); err != nil {
			return Trace{}, bad(err)
		}
	}
	if len(jobs) == 0 {
		return Trace{Jobs: jobs, LeftOut: leftOut}, nil
	}
	origin := mondayBefore(slices.MinFunc(arrivals, time.Time.Compare))
	latest := slices.MaxFunc(arrivals, time.Time.Compare)
	if span := latest.Sub(origin).Seconds(); span > maxSeconds {
		return Trace{}, fmt.Errorf("%w: the jobs span %.0f seconds from the Monday before the first, more than %d", ErrTrace, span, maxSeconds)
	}
	for i, at := range arrivals {
		jobs[i].Arrival = at.Sub(origin)
	}
	sort.SliceStable(jobs, func(i, j int) bool { return jobs[i].Arrival < jobs[j].Arrival })
	return Trace{Jobs: jobs, LeftOut: leftOut}, nil
}

// mondayBefore is 00:00 UTC of the Monday on or before t.
func mondayBefore(t time.Time) time.Time {
	t = t.UTC()
	day := time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
	return day.AddDate(0, 0, -((int(day.Weekday()) + 6) % 7))
}
