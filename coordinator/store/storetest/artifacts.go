package storetest

import (
	"slices"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/store"
)

func newArtifact(jobID int64, typ string, expire time.Time) *store.Artifact {
	return &store.Artifact{
		JobID:      jobID,
		Type:       typ,
		Format:     "zip",
		Filename:   typ + ".zip",
		Size:       1 << 33,
		StorageKey: "jobs/" + typ,
		ExpireAt:   expire,
		CreatedAt:  at(0),
	}
}

func testPutArtifact(t *testing.T, s store.Store) {
	ctx := t.Context()
	j := createJob(t, s)
	other := createJob(t, s)

	arch := newArtifact(j.ID, "archive", at(time.Hour))
	replaced, err := s.PutArtifact(ctx, arch)
	must(t, err)
	if replaced != nil {
		t.Errorf("first PutArtifact replaced %+v", replaced)
	}
	if arch.ID == 0 {
		t.Fatal("PutArtifact did not set ID")
	}
	meta := newArtifact(j.ID, "metadata", time.Time{})
	meta.Format = "gzip"
	_, err = s.PutArtifact(ctx, meta)
	must(t, err)
	otherArch := newArtifact(other.ID, "archive", at(time.Hour))
	_, err = s.PutArtifact(ctx, otherArch)
	must(t, err)

	// Same type again: the old one comes back and is gone from the list.
	arch2 := newArtifact(j.ID, "archive", at(2*time.Hour))
	arch2.StorageKey, arch2.Size = "jobs/archive-2", 10
	replaced, err = s.PutArtifact(ctx, arch2)
	must(t, err)
	check(t, "replaced artifact", replaced, arch)
	if arch2.ID == arch.ID || arch2.ID == 0 {
		t.Errorf("replacing artifact got ID %d (old %d), want a new one", arch2.ID, arch.ID)
	}

	list, err := s.ListArtifacts(ctx, j.ID)
	must(t, err)
	want := []*store.Artifact{meta, arch2}
	if len(list) != len(want) {
		t.Fatalf("ListArtifacts: %d artifacts, want %d", len(list), len(want))
	}
	for i := range want {
		check(t, "ListArtifacts (ordered by ID)", list[i], want[i])
	}
	list, err = s.ListArtifacts(ctx, other.ID)
	must(t, err)
	if len(list) != 1 {
		t.Fatalf("ListArtifacts(other job): %d artifacts, want 1", len(list))
	}
	check(t, "other job's artifact", list[0], otherArch)

	list, err = s.ListArtifacts(ctx, other.ID+1)
	must(t, err)
	if len(list) != 0 {
		t.Errorf("ListArtifacts(missing job): %d artifacts", len(list))
	}
	_, err = s.PutArtifact(ctx, newArtifact(other.ID+1, "archive", time.Time{}))
	wantErr(t, "PutArtifact(missing job)", err, store.ErrNotFound)
}

func testArtifactsOfType(t *testing.T, s store.Store) {
	ctx := t.Context()
	j := createJob(t, s)
	k := createJob(t, s)
	put := func(jobID int64, typ string, exp time.Time) *store.Artifact {
		a := newArtifact(jobID, typ, exp)
		_, err := s.PutArtifact(ctx, a)
		must(t, err)
		return a
	}
	ja := put(j.ID, "archive", time.Time{})
	js := put(j.ID, "snapshot", at(time.Hour))
	ks := put(k.ID, "snapshot", at(-time.Hour)) // expired: listed still
	put(k.ID, "archive", time.Time{})
	got, err := s.ArtifactsOfType(ctx, "snapshot")
	must(t, err)
	if len(got) != 2 {
		t.Fatalf("ArtifactsOfType(snapshot): %d artifacts, want 2", len(got))
	}
	check(t, "ArtifactsOfType (ordered by ID)", got[0], js)
	check(t, "ArtifactsOfType (ordered by ID)", got[1], ks)
	// A replaced artifact is gone from the list.
	js2 := put(j.ID, "snapshot", time.Time{})
	got, err = s.ArtifactsOfType(ctx, "snapshot")
	must(t, err)
	if len(got) != 2 || got[0].ID != ks.ID || got[1].ID != js2.ID {
		t.Errorf("ArtifactsOfType after a replace = %v, want %d and %d", got, ks.ID, js2.ID)
	}
	if got, err := s.ArtifactsOfType(ctx, "junit"); err != nil || len(got) != 0 {
		t.Errorf("ArtifactsOfType(junit) = %v, %v; want none", got, err)
	}
	got, err = s.ArtifactsOfType(ctx, "archive")
	must(t, err)
	if len(got) != 2 || got[0].ID != ja.ID {
		t.Errorf("ArtifactsOfType(archive) = %v, want 2 from %d", got, ja.ID)
	}
}

func testExpiredArtifacts(t *testing.T, s store.Store) {
	ctx := t.Context()
	j := createJob(t, s)
	k := createJob(t, s)
	put := func(jobID int64, typ string, exp time.Time) *store.Artifact {
		a := newArtifact(jobID, typ, exp)
		_, err := s.PutArtifact(ctx, a)
		must(t, err)
		return a
	}
	a3 := put(j.ID, "archive", at(3*time.Hour))
	never := put(j.ID, "metadata", time.Time{})
	a1 := put(j.ID, "junit", at(1*time.Hour))
	b1 := put(k.ID, "archive", at(1*time.Hour))
	b2 := put(k.ID, "trace", at(2*time.Hour))
	_ = never

	ids := func(as ...*store.Artifact) []int64 {
		var out []int64
		for _, a := range as {
			out = append(out, a.ID)
		}
		return out
	}
	tests := []struct {
		name   string
		before time.Time
		limit  int
		want   []int64
	}{
		{"none yet", at(time.Hour), 0, nil},
		{"strictly before", at(time.Hour + time.Microsecond), 0, ids(a1, b1)},
		{"ordered by expiry then ID", at(4 * time.Hour), 0, ids(a1, b1, b2, a3)},
		{"limit", at(4 * time.Hour), 3, ids(a1, b1, b2)},
		{"negative limit", at(4 * time.Hour), -1, ids(a1, b1, b2, a3)},
		{"far future skips never-expiring", time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC), 0, ids(a1, b1, b2, a3)},
	}
	for _, tt := range tests {
		got, err := s.ExpiredArtifacts(ctx, tt.before, tt.limit)
		must(t, err)
		var gotIDs []int64
		for _, a := range got {
			gotIDs = append(gotIDs, a.ID)
		}
		if !slices.Equal(gotIDs, tt.want) {
			t.Errorf("ExpiredArtifacts(%s) = %v, want %v", tt.name, gotIDs, tt.want)
		}
	}
	got, err := s.ExpiredArtifacts(ctx, at(2*time.Hour), 1)
	must(t, err)
	if len(got) == 1 {
		check(t, "expired artifact", got[0], a1)
	}
}

func testDeleteArtifact(t *testing.T, s store.Store) {
	ctx := t.Context()
	j := createJob(t, s)
	a := newArtifact(j.ID, "archive", at(time.Hour))
	b := newArtifact(j.ID, "metadata", at(time.Hour))
	_, err := s.PutArtifact(ctx, a)
	must(t, err)
	_, err = s.PutArtifact(ctx, b)
	must(t, err)

	must(t, s.DeleteArtifact(ctx, a.ID))
	wantErr(t, "DeleteArtifact twice", s.DeleteArtifact(ctx, a.ID), store.ErrNotFound)
	wantErr(t, "DeleteArtifact(missing)", s.DeleteArtifact(ctx, b.ID+1), store.ErrNotFound)
	list, err := s.ListArtifacts(ctx, j.ID)
	must(t, err)
	if len(list) != 1 || list[0].ID != b.ID {
		t.Errorf("ListArtifacts after delete = %v, want only %d", list, b.ID)
	}
	exp, err := s.ExpiredArtifacts(ctx, at(2*time.Hour), 0)
	must(t, err)
	if len(exp) != 1 || exp[0].ID != b.ID {
		t.Errorf("ExpiredArtifacts after delete = %v, want only %d", exp, b.ID)
	}
	// After a delete the type can be put again, replacing nothing.
	a2 := newArtifact(j.ID, "archive", time.Time{})
	replaced, err := s.PutArtifact(ctx, a2)
	must(t, err)
	if replaced != nil {
		t.Errorf("PutArtifact after delete replaced %+v", replaced)
	}
}
