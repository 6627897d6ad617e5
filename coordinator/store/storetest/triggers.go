package storetest

import (
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/store"
)

func testPipelineTriggers(t *testing.T, s store.Store) {
	ctx := t.Context()
	p := createProject(t, s, "acme/web")
	q := createProject(t, s, "acme/api")

	deploy := &store.PipelineTrigger{ProjectID: p.ID, Description: "deploy", OwnerID: 7, TokenDigest: digest(t), TokenHint: "glptt-ab12",
		CreatedAt: at(0), UpdatedAt: at(0), ExpiresAt: at(24 * time.Hour)}
	must(t, s.CreatePipelineTrigger(ctx, deploy))
	if deploy.ID <= 0 {
		t.Fatalf("CreatePipelineTrigger: ID %d", deploy.ID)
	}
	other := &store.PipelineTrigger{ProjectID: q.ID, TokenDigest: digest(t), CreatedAt: at(0), UpdatedAt: at(0)}
	must(t, s.CreatePipelineTrigger(ctx, other))
	wantErr(t, "CreatePipelineTrigger(same digest)", s.CreatePipelineTrigger(ctx, &store.PipelineTrigger{ProjectID: q.ID, TokenDigest: deploy.TokenDigest}), store.ErrExists)
	wantErr(t, "CreatePipelineTrigger(missing project)", s.CreatePipelineTrigger(ctx, &store.PipelineTrigger{ProjectID: p.ID + q.ID + 100, TokenDigest: digest(t)}), store.ErrNotFound)
	if err := s.CreatePipelineTrigger(ctx, &store.PipelineTrigger{ProjectID: p.ID}); err == nil {
		t.Error("CreatePipelineTrigger without a digest: no error")
	}

	got, err := s.GetPipelineTrigger(ctx, deploy.ID)
	must(t, err)
	check(t, "GetPipelineTrigger", got, deploy)
	got, err = s.PipelineTriggerByDigest(ctx, deploy.TokenDigest)
	must(t, err)
	check(t, "PipelineTriggerByDigest", got, deploy)
	_, err = s.PipelineTriggerByDigest(ctx, "")
	wantErr(t, "PipelineTriggerByDigest(empty)", err, store.ErrNotFound)
	_, err = s.PipelineTriggerByDigest(ctx, digest(t))
	wantErr(t, "PipelineTriggerByDigest(unknown)", err, store.ErrNotFound)
	_, err = s.GetPipelineTrigger(ctx, other.ID+100)
	wantErr(t, "GetPipelineTrigger(missing)", err, store.ErrNotFound)

	// Update writes the description, the owner and UpdatedAt only.
	u := *deploy
	u.Description, u.OwnerID, u.UpdatedAt = "deploy prod", 0, at(time.Hour)
	u.TokenDigest, u.TokenHint, u.ExpiresAt = "ignored", "ignored", at(0)
	must(t, s.UpdatePipelineTrigger(ctx, &u))
	deploy.Description, deploy.OwnerID, deploy.UpdatedAt = "deploy prod", 0, at(time.Hour)
	must(t, s.TouchPipelineTrigger(ctx, deploy.ID, at(2*time.Hour)))
	deploy.LastUsed = at(2 * time.Hour)
	got, err = s.GetPipelineTrigger(ctx, deploy.ID)
	must(t, err)
	check(t, "GetPipelineTrigger after update and touch", got, deploy)
	wantErr(t, "UpdatePipelineTrigger(missing)", s.UpdatePipelineTrigger(ctx, &store.PipelineTrigger{ID: other.ID + 100}), store.ErrNotFound)
	wantErr(t, "TouchPipelineTrigger(missing)", s.TouchPipelineTrigger(ctx, other.ID+100, at(0)), store.ErrNotFound)

	list, err := s.ListPipelineTriggers(ctx, p.ID)
	must(t, err)
	if len(list) != 1 {
		t.Fatalf("ListPipelineTriggers: %d, want 1", len(list))
	}
	check(t, "ListPipelineTriggers", list[0], deploy)

	must(t, s.DeletePipelineTrigger(ctx, deploy.ID))
	wantErr(t, "DeletePipelineTrigger(again)", s.DeletePipelineTrigger(ctx, deploy.ID), store.ErrNotFound)
	_, err = s.PipelineTriggerByDigest(ctx, deploy.TokenDigest)
	wantErr(t, "PipelineTriggerByDigest(deleted)", err, store.ErrNotFound)
}
