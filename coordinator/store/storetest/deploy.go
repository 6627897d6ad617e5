package storetest

import (
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/store"
)

func testEnvironments(t *testing.T, s store.Store) {
	ctx := t.Context()
	p, q := createProject(t, s, "p"), createProject(t, s, "q")
	e := &store.Environment{ProjectID: p.ID, Name: "review/feature", Slug: "review-feature-abc123", ExternalURL: "https://r.test",
		Tier: "development", CreatedAt: at(0), UpdatedAt: at(0)}
	created, err := s.EnsureEnvironment(ctx, e)
	must(t, err)
	if !created || e.ID <= 0 || e.State != store.EnvironmentAvailable {
		t.Fatalf("EnsureEnvironment = %v, %+v; want created, an id, available", created, e)
	}
	want := *e
	// The same name again returns the stored one, whatever else is given.
	again := &store.Environment{ProjectID: p.ID, Name: "review/feature", ExternalURL: "https://other.test", Tier: "production"}
	created, err = s.EnsureEnvironment(ctx, again)
	must(t, err)
	if created {
		t.Error("EnsureEnvironment of an existing name created another")
	}
	check(t, "EnsureEnvironment(existing)", again, &want)
	// Another project may use the name; Tier and State default.
	other := &store.Environment{ProjectID: q.ID, Name: "review/feature"}
	_, err = s.EnsureEnvironment(ctx, other)
	must(t, err)
	if other.ID == e.ID || other.Tier != "other" || other.State != store.EnvironmentAvailable {
		t.Errorf("environment of another project = %+v", other)
	}
	_, err = s.EnsureEnvironment(ctx, &store.Environment{ProjectID: q.ID + 100, Name: "x"})
	wantErr(t, "EnsureEnvironment(missing project)", err, store.ErrNotFound)

	got, err := s.GetEnvironment(ctx, e.ID)
	must(t, err)
	check(t, "GetEnvironment", got, &want)
	_, err = s.GetEnvironment(ctx, other.ID+100)
	wantErr(t, "GetEnvironment(missing)", err, store.ErrNotFound)

	prod := &store.Environment{ProjectID: p.ID, Name: "production", Tier: "production", CreatedAt: at(time.Second)}
	_, err = s.EnsureEnvironment(ctx, prod)
	must(t, err)
	list, err := s.ListEnvironments(ctx, p.ID)
	must(t, err)
	if len(list) != 2 || list[0].ID != e.ID || list[1].ID != prod.ID {
		t.Errorf("ListEnvironments = %+v", list)
	}

	// UpdateEnvironment writes URL, tier, state, auto stop and update time.
	u := *e
	u.Name, u.Slug, u.CreatedAt = "ignored", "ignored", at(time.Hour)
	u.ExternalURL, u.Tier, u.State, u.AutoStopAt, u.UpdatedAt = "https://new.test", "staging", store.EnvironmentStopped, at(time.Hour), at(time.Minute)
	must(t, s.UpdateEnvironment(ctx, &u))
	want.ExternalURL, want.Tier, want.State, want.AutoStopAt, want.UpdatedAt = "https://new.test", "staging", store.EnvironmentStopped, at(time.Hour), at(time.Minute)
	got, err = s.GetEnvironment(ctx, e.ID)
	must(t, err)
	check(t, "GetEnvironment after UpdateEnvironment", got, &want)
	wantErr(t, "UpdateEnvironment(missing)", s.UpdateEnvironment(ctx, &store.Environment{ID: other.ID + 100}), store.ErrNotFound)

	// DueEnvironments: available ones whose auto stop time has passed.
	prod.AutoStopAt, prod.UpdatedAt = at(2*time.Hour), at(0)
	must(t, s.UpdateEnvironment(ctx, prod))
	other.AutoStopAt = at(3 * time.Hour)
	must(t, s.UpdateEnvironment(ctx, other))
	due, err := s.DueEnvironments(ctx, at(3*time.Hour), 0)
	must(t, err)
	if len(due) != 1 || due[0].ID != prod.ID {
		t.Errorf("DueEnvironments(3h) = %+v, want only %d (e is stopped, other is not due yet)", due, prod.ID)
	}
	due, err = s.DueEnvironments(ctx, at(4*time.Hour), 1)
	must(t, err)
	if len(due) != 1 || due[0].ID != prod.ID {
		t.Errorf("DueEnvironments(4h, limit 1) = %+v, want the soonest", due)
	}
}

func testDeployments(t *testing.T, s store.Store) {
	ctx := t.Context()
	p, q := createProject(t, s, "p"), createProject(t, s, "q")
	e := &store.Environment{ProjectID: p.ID, Name: "production"}
	_, err := s.EnsureEnvironment(ctx, e)
	must(t, err)
	j1, j2, j3 := createJob(t, s), createJob(t, s), createJob(t, s)
	d1 := &store.Deployment{ProjectID: p.ID, EnvironmentID: e.ID, JobID: j1.ID, PipelineID: 7, Ref: "main", Sha: "abc",
		Status: "created", OnStop: "stop", AutoStopIn: "1 day", CreatedAt: at(0), UpdatedAt: at(0)}
	must(t, s.CreateDeployment(ctx, d1))
	if d1.ID <= 0 || d1.IID != 1 {
		t.Fatalf("CreateDeployment: id %d iid %d, want an id and iid 1", d1.ID, d1.IID)
	}
	wantErr(t, "CreateDeployment(same job)", s.CreateDeployment(ctx, &store.Deployment{ProjectID: p.ID, EnvironmentID: e.ID, JobID: j1.ID, Status: "created"}), store.ErrExists)
	wantErr(t, "CreateDeployment(missing environment)", s.CreateDeployment(ctx, &store.Deployment{ProjectID: p.ID, EnvironmentID: e.ID + 100, JobID: j3.ID, Status: "created"}), store.ErrNotFound)
	d2 := &store.Deployment{ProjectID: p.ID, EnvironmentID: e.ID, JobID: j2.ID, PipelineID: 8, Ref: "v1", Tag: true, Status: "created"}
	must(t, s.CreateDeployment(ctx, d2))
	eq := &store.Environment{ProjectID: q.ID, Name: "production"}
	_, err = s.EnsureEnvironment(ctx, eq)
	must(t, err)
	d3 := &store.Deployment{ProjectID: q.ID, EnvironmentID: eq.ID, JobID: j3.ID, PipelineID: 7, Status: "created"}
	must(t, s.CreateDeployment(ctx, d3))
	if d2.IID != 2 || d3.IID != 1 {
		t.Errorf("IIDs %d and %d, want 2 (same project) and 1 (another project)", d2.IID, d3.IID)
	}

	nd, err := s.UpdateDeployment(ctx, d1.ID, store.DeploymentUpdate{Status: "running", UpdatedAt: at(time.Second)})
	must(t, err)
	want := *d1
	want.Status, want.UpdatedAt = "running", at(time.Second)
	check(t, "UpdateDeployment(running)", nd, &want)
	nd, err = s.UpdateDeployment(ctx, d1.ID, store.DeploymentUpdate{Status: "success", UpdatedAt: at(time.Minute), FinishedAt: at(time.Minute)})
	must(t, err)
	want.Status, want.UpdatedAt, want.FinishedAt = "success", at(time.Minute), at(time.Minute)
	check(t, "UpdateDeployment(success)", nd, &want)
	_, err = s.UpdateDeployment(ctx, d3.ID+100, store.DeploymentUpdate{Status: "failed"})
	wantErr(t, "UpdateDeployment(missing)", err, store.ErrNotFound)

	ids := func(ds []*store.Deployment) []int64 {
		out := []int64{}
		for _, d := range ds {
			out = append(out, d.ID)
		}
		return out
	}
	for _, tt := range []struct {
		name string
		f    store.DeploymentFilter
		want []int64
	}{
		{"all", store.DeploymentFilter{}, []int64{d1.ID, d2.ID, d3.ID}},
		{"project", store.DeploymentFilter{ProjectID: p.ID}, []int64{d1.ID, d2.ID}},
		{"environment", store.DeploymentFilter{EnvironmentID: eq.ID}, []int64{d3.ID}},
		{"pipeline", store.DeploymentFilter{PipelineID: 7}, []int64{d1.ID, d3.ID}},
		{"statuses", store.DeploymentFilter{Statuses: []string{"success", "failed"}}, []int64{d1.ID}},
		{"project and status", store.DeploymentFilter{ProjectID: p.ID, Statuses: []string{"created"}}, []int64{d2.ID}},
	} {
		got, err := s.ListDeployments(ctx, tt.f)
		must(t, err)
		if g := ids(got); len(g) != len(tt.want) || (len(g) > 0 && !equalIDs(g, tt.want)) {
			t.Errorf("ListDeployments(%s) = %v, want %v", tt.name, g, tt.want)
		}
	}
	got, err := s.ListDeployments(ctx, store.DeploymentFilter{PipelineID: 8})
	must(t, err)
	if len(got) != 1 || !got[0].Tag || got[0].Ref != "v1" {
		t.Errorf("ListDeployments(pipeline 8) = %+v", got)
	}
}

func equalIDs(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func testReleases(t *testing.T, s store.Store) {
	ctx := t.Context()
	p, q := createProject(t, s, "p"), createProject(t, s, "q")
	r1 := &store.Release{ProjectID: p.ID, TagName: "v1", Name: "One", Description: "first", Sha: "abc",
		Milestones: []string{"m1", "m2"}, Links: []store.ReleaseLink{{ID: 1, Name: "bin", URL: "https://x.test/bin", LinkType: "package", DirectAssetPath: "/bin"}},
		JobID: 12, ReleasedAt: at(time.Hour), CreatedAt: at(time.Hour)}
	must(t, s.CreateRelease(ctx, r1))
	if r1.ID <= 0 {
		t.Fatal("CreateRelease set no id")
	}
	wantErr(t, "CreateRelease(same tag)", s.CreateRelease(ctx, &store.Release{ProjectID: p.ID, TagName: "v1"}), store.ErrExists)
	wantErr(t, "CreateRelease(missing project)", s.CreateRelease(ctx, &store.Release{ProjectID: q.ID + 100, TagName: "v1"}), store.ErrNotFound)
	must(t, s.CreateRelease(ctx, &store.Release{ProjectID: q.ID, TagName: "v1", ReleasedAt: at(0)}))
	r0 := &store.Release{ProjectID: p.ID, TagName: "v0", ReleasedAt: at(0), CreatedAt: at(2 * time.Hour)}
	must(t, s.CreateRelease(ctx, r0))
	r2 := &store.Release{ProjectID: p.ID, TagName: "v2", ReleasedAt: at(2 * time.Hour)}
	must(t, s.CreateRelease(ctx, r2))

	got, err := s.GetRelease(ctx, p.ID, "v1")
	must(t, err)
	check(t, "GetRelease", got, r1)
	_, err = s.GetRelease(ctx, p.ID, "v9")
	wantErr(t, "GetRelease(missing)", err, store.ErrNotFound)

	list, err := s.ListReleases(ctx, p.ID)
	must(t, err)
	var tags []string
	for _, r := range list {
		tags = append(tags, r.TagName)
	}
	if len(tags) != 3 || tags[0] != "v2" || tags[1] != "v1" || tags[2] != "v0" {
		t.Errorf("ListReleases = %v, want newest released first: v2 v1 v0", tags)
	}
}

func testPagesDeployments(t *testing.T, s store.Store) {
	ctx := t.Context()
	p := createProject(t, s, "p")
	j1, j2, j3 := createJob(t, s), createJob(t, s), createJob(t, s)
	main1 := &store.PagesDeployment{ProjectID: p.ID, JobID: j1.ID, Dir: "d1", Size: 10, FileCount: 2, CreatedAt: at(0)}
	replaced, err := s.PutPagesDeployment(ctx, main1)
	must(t, err)
	if replaced != nil || main1.ID <= 0 {
		t.Fatalf("first PutPagesDeployment: replaced %+v, id %d", replaced, main1.ID)
	}
	mr := &store.PagesDeployment{ProjectID: p.ID, JobID: j2.ID, PathPrefix: "mr-1", Dir: "d2", ExpireAt: at(24 * time.Hour), CreatedAt: at(time.Second)}
	_, err = s.PutPagesDeployment(ctx, mr)
	must(t, err)
	main2 := &store.PagesDeployment{ProjectID: p.ID, JobID: j3.ID, Dir: "d3", CreatedAt: at(time.Minute)}
	replaced, err = s.PutPagesDeployment(ctx, main2)
	must(t, err)
	check(t, "replaced", replaced, main1)
	_, err = s.PutPagesDeployment(ctx, &store.PagesDeployment{ProjectID: p.ID, JobID: j3.ID + 100, Dir: "x", PathPrefix: "y"})
	wantErr(t, "PutPagesDeployment(missing job)", err, store.ErrNotFound)

	list, err := s.ListPagesDeployments(ctx, p.ID)
	must(t, err)
	if len(list) != 2 {
		t.Fatalf("ListPagesDeployments = %+v, want the prefix one and the new main one", list)
	}
	check(t, "list[0]", list[0], mr)
	check(t, "list[1]", list[1], main2)

	exp, err := s.ExpiredPagesDeployments(ctx, at(24*time.Hour), 0)
	must(t, err)
	if len(exp) != 0 {
		t.Errorf("ExpiredPagesDeployments(at expiry) = %+v, want none (strictly before)", exp)
	}
	exp, err = s.ExpiredPagesDeployments(ctx, at(25*time.Hour), 10)
	must(t, err)
	if len(exp) != 1 || exp[0].ID != mr.ID {
		t.Errorf("ExpiredPagesDeployments = %+v, want %d", exp, mr.ID)
	}
	must(t, s.DeletePagesDeployment(ctx, mr.ID))
	wantErr(t, "DeletePagesDeployment(again)", s.DeletePagesDeployment(ctx, mr.ID), store.ErrNotFound)
}
