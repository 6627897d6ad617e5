package storetest

import (
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/store"
)

func testPipelineSchedules(t *testing.T, s store.Store) {
	ctx := t.Context()
	p := createProject(t, s, "acme/web")
	q := createProject(t, s, "acme/api")

	nightly := &store.PipelineSchedule{ProjectID: p.ID, Description: "nightly", Ref: "main", Cron: "0 2 * * *", CronTimezone: "Europe/Berlin",
		Active: true, NextRunAt: at(time.Hour), OwnerID: 7,
		Variables: []store.PipelineVariable{{Key: "SUITE", Value: "full"}, {Key: "CFG", Value: "x=1", File: true}},
		Inputs:    []store.ScheduleInput{{Name: "env", Value: "staging"}, {Name: "dry", Value: true}, {Name: "n", Value: 2.5}, {Name: "list", Value: []any{"a", "b"}}},
		CreatedAt: at(0), UpdatedAt: at(0)}
	must(t, s.CreatePipelineSchedule(ctx, nightly))
	if nightly.ID <= 0 || nightly.Version != 1 {
		t.Fatalf("CreatePipelineSchedule: ID %d version %d, want > 0 and 1", nightly.ID, nightly.Version)
	}
	got, err := s.GetPipelineSchedule(ctx, nightly.ID)
	must(t, err)
	check(t, "GetPipelineSchedule", got, nightly)

	// No variables, no inputs, no next run (a cron that never matches
	// again), inactive.
	paused := &store.PipelineSchedule{ProjectID: p.ID, Description: "paused", Ref: "refs/tags/v1", Cron: "@daily", CronTimezone: "UTC", CreatedAt: at(0), UpdatedAt: at(0)}
	must(t, s.CreatePipelineSchedule(ctx, paused))
	other := &store.PipelineSchedule{ProjectID: q.ID, Description: "other", Ref: "main", Cron: "* * * * *", CronTimezone: "UTC", Active: true, NextRunAt: at(time.Minute), CreatedAt: at(0), UpdatedAt: at(0)}
	must(t, s.CreatePipelineSchedule(ctx, other))
	wantErr(t, "CreatePipelineSchedule(missing project)", s.CreatePipelineSchedule(ctx, &store.PipelineSchedule{ProjectID: p.ID + q.ID + 100, Description: "x", Ref: "main", Cron: "@daily", CronTimezone: "UTC"}), store.ErrNotFound)
	_, err = s.GetPipelineSchedule(ctx, other.ID+100)
	wantErr(t, "GetPipelineSchedule(missing)", err, store.ErrNotFound)

	list, err := s.ListPipelineSchedules(ctx, p.ID)
	must(t, err)
	checkSchedules(t, "ListPipelineSchedules", list, nightly, paused)

	// Due: active, with a next run, not after t; soonest first.
	due, err := s.DuePipelineSchedules(ctx, at(time.Hour-time.Second), 10)
	must(t, err)
	checkSchedules(t, "DuePipelineSchedules(before the hour)", due, other)
	due, err = s.DuePipelineSchedules(ctx, at(time.Hour), 10)
	must(t, err)
	checkSchedules(t, "DuePipelineSchedules(at the hour)", due, other, nightly)
	due, err = s.DuePipelineSchedules(ctx, at(time.Hour), 1)
	must(t, err)
	checkSchedules(t, "DuePipelineSchedules(limit 1)", due, other)

	// An update applies at the version read, once.
	stale := *nightly
	nightly.Description, nightly.Ref, nightly.Cron, nightly.CronTimezone = "nightly full", "develop", "30 3 * * 1-5", "UTC"
	nightly.Active, nightly.NextRunAt, nightly.OwnerID, nightly.UpdatedAt = false, at(2*time.Hour), 0, at(time.Minute)
	nightly.Variables, nightly.Inputs = []store.PipelineVariable{{Key: "SUITE", Value: "smoke"}}, nil
	must(t, s.UpdatePipelineSchedule(ctx, nightly))
	if nightly.Version != 2 {
		t.Errorf("Version after update = %d, want 2", nightly.Version)
	}
	got, err = s.GetPipelineSchedule(ctx, nightly.ID)
	must(t, err)
	check(t, "GetPipelineSchedule after update", got, nightly)
	stale.Description = "lost"
	wantErr(t, "UpdatePipelineSchedule(stale version)", s.UpdatePipelineSchedule(ctx, &stale), store.ErrConflict)
	got, err = s.GetPipelineSchedule(ctx, nightly.ID)
	must(t, err)
	check(t, "GetPipelineSchedule after a stale update", got, nightly)
	missing := *nightly
	missing.ID = other.ID + 100
	wantErr(t, "UpdatePipelineSchedule(missing)", s.UpdatePipelineSchedule(ctx, &missing), store.ErrNotFound)
	due, err = s.DuePipelineSchedules(ctx, at(24*time.Hour), 10)
	must(t, err)
	checkSchedules(t, "DuePipelineSchedules(inactive left out)", due, other)

	// The pipelines a schedule created.
	pl1 := &store.Pipeline{ProjectID: q.ID, Ref: "main", Sha: "a", Source: "schedule", CreatedAt: at(0)}
	pl2 := &store.Pipeline{ProjectID: q.ID, Ref: "main", Sha: "b", Source: "schedule", CreatedAt: at(0)}
	pl3 := &store.Pipeline{ProjectID: q.ID, Ref: "main", Sha: "c", Source: "push", CreatedAt: at(0)}
	for _, pl := range []*store.Pipeline{pl1, pl2, pl3} {
		must(t, s.CreatePipeline(ctx, pl))
	}
	must(t, s.AddSchedulePipeline(ctx, other.ID, pl1.ID))
	must(t, s.AddSchedulePipeline(ctx, other.ID, pl2.ID))
	must(t, s.AddSchedulePipeline(ctx, other.ID, pl2.ID)) // again: no error
	wantErr(t, "AddSchedulePipeline(missing schedule)", s.AddSchedulePipeline(ctx, other.ID+100, pl1.ID), store.ErrNotFound)
	wantErr(t, "AddSchedulePipeline(missing pipeline)", s.AddSchedulePipeline(ctx, other.ID, pl3.ID+100), store.ErrNotFound)
	got, err = s.GetPipelineSchedule(ctx, other.ID)
	must(t, err)
	if got.LastPipelineID != pl2.ID {
		t.Errorf("LastPipelineID = %d, want %d", got.LastPipelineID, pl2.ID)
	}
	pls, err := s.ListPipelines(ctx, store.PipelineFilter{ScheduleID: other.ID})
	must(t, err)
	checkIDs(t, "ListPipelines(ScheduleID)", pipelineIDs(pls), []int64{pl1.ID, pl2.ID})
	pls, err = s.ListPipelines(ctx, store.PipelineFilter{ProjectID: q.ID, Source: "push"})
	must(t, err)
	checkIDs(t, "ListPipelines(Source)", pipelineIDs(pls), []int64{pl3.ID})
	must(t, s.DeletePipeline(ctx, pl2.ID))
	got, err = s.GetPipelineSchedule(ctx, other.ID)
	must(t, err)
	if got.LastPipelineID != pl1.ID {
		t.Errorf("LastPipelineID after deleting the newest pipeline = %d, want %d", got.LastPipelineID, pl1.ID)
	}

	// Deleting a schedule keeps its pipelines.
	must(t, s.DeletePipelineSchedule(ctx, other.ID))
	wantErr(t, "DeletePipelineSchedule(again)", s.DeletePipelineSchedule(ctx, other.ID), store.ErrNotFound)
	if _, err := s.GetPipeline(ctx, pl1.ID); err != nil {
		t.Errorf("pipeline of a deleted schedule: %v", err)
	}
	pls, err = s.ListPipelines(ctx, store.PipelineFilter{ScheduleID: other.ID})
	must(t, err)
	checkIDs(t, "ListPipelines(deleted schedule)", pipelineIDs(pls), nil)
}

func pipelineIDs(ps []*store.Pipeline) []int64 {
	var ids []int64
	for _, p := range ps {
		ids = append(ids, p.ID)
	}
	return ids
}

func checkSchedules(t testing.TB, what string, got []*store.PipelineSchedule, want ...*store.PipelineSchedule) {
	t.Helper()
	if len(got) != len(want) {
		var ids []int64
		for _, g := range got {
			ids = append(ids, g.ID)
		}
		t.Errorf("%s: schedules %v, want %d", what, ids, len(want))
		return
	}
	for i := range got {
		check(t, what, got[i], want[i])
	}
}
