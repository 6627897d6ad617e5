package storetest

import (
	"bytes"
	"slices"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/store"
)

func createProject(t testing.TB, s store.Store, path string) *store.Project {
	t.Helper()
	p := &store.Project{Path: path, Name: path, DefaultBranch: "main", CreatedAt: at(0)}
	must(t, s.CreateProject(t.Context(), p))
	return p
}

func testProjects(t *testing.T, s store.Store) {
	ctx := t.Context()
	p := &store.Project{Path: "group/sub/demo", Name: "Demo", Description: "d", DefaultBranch: "main", MinIsolation: "container", CreatedAt: at(time.Second)}
	must(t, s.CreateProject(ctx, p))
	if p.ID <= 0 {
		t.Fatalf("CreateProject: ID %d, want > 0", p.ID)
	}
	if p.Visibility != "private" {
		t.Errorf("Visibility after create = %q, want the default private", p.Visibility)
	}
	got, err := s.GetProject(ctx, p.ID)
	must(t, err)
	check(t, "GetProject", got, p)
	got, err = s.ProjectByPath(ctx, "group/sub/demo")
	must(t, err)
	check(t, "ProjectByPath", got, p)

	dup := &store.Project{Path: "group/sub/demo"}
	wantErr(t, "CreateProject(same path)", s.CreateProject(ctx, dup), store.ErrExists)
	_, err = s.GetProject(ctx, p.ID+1)
	wantErr(t, "GetProject(missing)", err, store.ErrNotFound)
	_, err = s.ProjectByPath(ctx, "group/sub")
	wantErr(t, "ProjectByPath(missing)", err, store.ErrNotFound)

	q := &store.Project{Path: "other", Visibility: "public", CreatedAt: at(0)}
	must(t, s.CreateProject(ctx, q))
	list, err := s.ListProjects(ctx)
	must(t, err)
	if len(list) != 2 || list[0].ID != p.ID || list[1].ID != q.ID || list[1].Visibility != "public" {
		t.Errorf("ListProjects = %+v, want [%d %d(public)]", list, p.ID, q.ID)
	}

	// UpdateProject writes the settable fields, not Path or CreatedAt.
	u := *p
	u.Path, u.CreatedAt = "ignored/path", at(time.Hour)
	u.Name, u.Description, u.DefaultBranch, u.Visibility, u.MinIsolation = "Demo 2", "d2", "trunk", "public", "vm"
	must(t, s.UpdateProject(ctx, &u))
	want := *p
	want.Name, want.Description, want.DefaultBranch, want.Visibility, want.MinIsolation = "Demo 2", "d2", "trunk", "public", "vm"
	got, err = s.GetProject(ctx, p.ID)
	must(t, err)
	check(t, "GetProject after UpdateProject", got, &want)
	u.MinIsolation, u.Visibility = "", ""
	must(t, s.UpdateProject(ctx, &u))
	if got, err = s.GetProject(ctx, p.ID); err != nil || got.MinIsolation != "" || got.Visibility != "private" {
		t.Errorf("GetProject after clearing MinIsolation and Visibility = %+v, %v; want no minimum, private", got, err)
	}
	wantErr(t, "UpdateProject(missing)", s.UpdateProject(ctx, &store.Project{ID: q.ID + 1, Name: "x"}), store.ErrNotFound)
}

func testPipelines(t *testing.T, s store.Store) {
	ctx := t.Context()
	a, b := createProject(t, s, "a"), createProject(t, s, "b")
	mk := func(p *store.Project, ref string) *store.Pipeline {
		pl := &store.Pipeline{ProjectID: p.ID, Ref: ref, Sha: "0123456789abcdef0123456789abcdef01234567",
			BeforeSha: "0000000000000000000000000000000000000000", Source: "push", Protected: true, CreatedAt: at(0), UpdatedAt: at(0)}
		must(t, s.CreatePipeline(ctx, pl))
		return pl
	}
	p1, p2, q1, p3 := mk(a, "main"), mk(a, "dev"), mk(b, "main"), mk(a, "main")
	for i, tt := range []struct {
		p   *store.Pipeline
		iid int64
	}{{p1, 1}, {p2, 2}, {q1, 1}, {p3, 3}} {
		if tt.p.IID != tt.iid {
			t.Errorf("pipeline %d: IID %d, want %d (per project)", i, tt.p.IID, tt.iid)
		}
		if tt.p.Status != store.StatusCreated {
			t.Errorf("pipeline %d: status %q, want created (the default)", i, tt.p.Status)
		}
	}
	got, err := s.GetPipeline(ctx, p2.ID)
	must(t, err)
	check(t, "GetPipeline", got, p2)

	wantErr(t, "CreatePipeline(missing project)", s.CreatePipeline(ctx, &store.Pipeline{ProjectID: b.ID + 100}), store.ErrNotFound)
	_, err = s.GetPipeline(ctx, p3.ID+100)
	wantErr(t, "GetPipeline(missing)", err, store.ErrNotFound)

	// Update: times set once stay, FinishedAt can be cleared.
	u, err := s.UpdatePipeline(ctx, p1.ID, store.PipelineUpdate{Status: store.StatusRunning, StartedAt: at(time.Minute), UpdatedAt: at(time.Minute)})
	must(t, err)
	want := *p1
	want.Status, want.StartedAt, want.UpdatedAt = store.StatusRunning, at(time.Minute), at(time.Minute)
	check(t, "UpdatePipeline(running)", u, &want)
	u, err = s.UpdatePipeline(ctx, p1.ID, store.PipelineUpdate{Status: store.StatusFailed, FinishedAt: at(2 * time.Minute), UpdatedAt: at(2 * time.Minute)})
	must(t, err)
	want.Status, want.FinishedAt, want.UpdatedAt = store.StatusFailed, at(2*time.Minute), at(2*time.Minute)
	check(t, "UpdatePipeline(failed)", u, &want)
	u, err = s.UpdatePipeline(ctx, p1.ID, store.PipelineUpdate{Status: store.StatusRunning, ClearFinished: true, UpdatedAt: at(3 * time.Minute)})
	must(t, err)
	want.Status, want.FinishedAt, want.UpdatedAt = store.StatusRunning, time.Time{}, at(3*time.Minute)
	check(t, "UpdatePipeline(retried)", u, &want)
	_, err = s.UpdatePipeline(ctx, p3.ID+100, store.PipelineUpdate{Status: store.StatusRunning})
	wantErr(t, "UpdatePipeline(missing)", err, store.ErrNotFound)
	_, err = s.UpdatePipeline(ctx, p1.ID, store.PipelineUpdate{Status: "bogus"})
	if err == nil {
		t.Error("UpdatePipeline(bogus status) succeeded, want an error")
	}

	ids := func(ps ...*store.Pipeline) []int64 {
		var out []int64
		for _, p := range ps {
			out = append(out, p.ID)
		}
		return out
	}
	for _, tt := range []struct {
		name string
		f    store.PipelineFilter
		want []int64
	}{
		{"all", store.PipelineFilter{}, ids(p1, p2, q1, p3)},
		{"project a", store.PipelineFilter{ProjectID: a.ID}, ids(p1, p2, p3)},
		{"project a newest first", store.PipelineFilter{ProjectID: a.ID, Newest: true}, ids(p3, p2, p1)},
		{"ref main", store.PipelineFilter{Ref: "main"}, ids(p1, q1, p3)},
		{"running", store.PipelineFilter{Statuses: []store.Status{store.StatusRunning}}, ids(p1)},
		{"created", store.PipelineFilter{Statuses: []store.Status{store.StatusCreated}}, ids(p2, q1, p3)},
		{"limit and offset", store.PipelineFilter{Limit: 2, Offset: 1}, ids(p2, q1)},
		{"offset only", store.PipelineFilter{Offset: 3}, ids(p3)},
		{"sha", store.PipelineFilter{Sha: "nope"}, nil},
	} {
		got, err := s.ListPipelines(ctx, tt.f)
		must(t, err)
		var gotIDs []int64
		for _, p := range got {
			gotIDs = append(gotIDs, p.ID)
		}
		if !slices.Equal(gotIDs, tt.want) {
			t.Errorf("ListPipelines(%s) = %v, want %v", tt.name, gotIDs, tt.want)
		}
	}

	// A failure reason and YAML errors set by an update stay until
	// replaced.
	u, err = s.UpdatePipeline(ctx, p1.ID, store.PipelineUpdate{Status: store.StatusFailed, FailureReason: "unknown_failure", YAMLErrors: "why", UpdatedAt: at(4 * time.Minute)})
	must(t, err)
	want.Status, want.FailureReason, want.YAMLErrors, want.UpdatedAt = store.StatusFailed, "unknown_failure", "why", at(4*time.Minute)
	check(t, "UpdatePipeline(failure reason)", u, &want)
	u, err = s.UpdatePipeline(ctx, p1.ID, store.PipelineUpdate{Status: store.StatusFailed, UpdatedAt: at(5 * time.Minute)})
	must(t, err)
	want.UpdatedAt = at(5 * time.Minute)
	check(t, "UpdatePipeline(reason kept)", u, &want)
}

func testVariables(t *testing.T, s store.Store) {
	ctx := t.Context()
	p := createProject(t, s, "vars")
	v := &store.Variable{ProjectID: p.ID, Key: "TOKEN", Value: "s3cr3t-value", Masked: true, Protected: true, Description: "d"}
	must(t, s.CreateVariable(ctx, v))
	got, err := s.GetVariable(ctx, p.ID, "TOKEN")
	must(t, err)
	check(t, "GetVariable", got, v)
	wantErr(t, "CreateVariable(same key)", s.CreateVariable(ctx, &store.Variable{ProjectID: p.ID, Key: "TOKEN"}), store.ErrExists)
	wantErr(t, "CreateVariable(missing project)", s.CreateVariable(ctx, &store.Variable{ProjectID: p.ID + 1, Key: "X"}), store.ErrNotFound)

	v2 := &store.Variable{ProjectID: p.ID, Key: "TOKEN", Value: "other", File: true, Raw: true}
	must(t, s.UpdateVariable(ctx, v2))
	got, err = s.GetVariable(ctx, p.ID, "TOKEN")
	must(t, err)
	check(t, "GetVariable after update", got, v2)
	wantErr(t, "UpdateVariable(missing)", s.UpdateVariable(ctx, &store.Variable{ProjectID: p.ID, Key: "NOPE"}), store.ErrNotFound)

	must(t, s.CreateVariable(ctx, &store.Variable{ProjectID: p.ID, Key: "A", Value: "1"}))
	list, err := s.ListVariables(ctx, p.ID)
	must(t, err)
	if len(list) != 2 || list[0].Key != "A" || list[1].Key != "TOKEN" {
		t.Errorf("ListVariables = %+v, want A, TOKEN (by key)", list)
	}
	must(t, s.DeleteVariable(ctx, p.ID, "A"))
	wantErr(t, "DeleteVariable(again)", s.DeleteVariable(ctx, p.ID, "A"), store.ErrNotFound)
	_, err = s.GetVariable(ctx, p.ID, "A")
	wantErr(t, "GetVariable(deleted)", err, store.ErrNotFound)
}

// testPipelineJobStatuses walks a job through the statuses only pipeline
// jobs have, and checks the fields pipelines use.
func testPipelineJobStatuses(t *testing.T, s store.Store) {
	ctx := t.Context()
	for _, st := range []store.Status{store.StatusCreated, store.StatusManual, store.StatusScheduled, store.StatusWaitingForResource} {
		j := createJob(t, s, func(j *store.Job) { j.Status = st; j.Graph = []byte(`{"when":"manual"}`) })
		got := getJob(t, s, j.ID)
		if got.Status != st || string(got.Graph) != `{"when":"manual"}` || got.Retried {
			t.Errorf("CreateJob(%s): got status %s graph %q retried %v", st, got.Status, got.Graph, got.Retried)
		}
	}
	for _, st := range []store.Status{store.StatusSkipped, store.StatusCanceling, store.StatusFailed} {
		j := newJob()
		j.Status = st
		if err := s.CreateJob(ctx, j); err == nil {
			t.Errorf("CreateJob(status %s) succeeded, want an error", st)
		}
	}

	j := createJob(t, s, func(j *store.Job) { j.Status = store.StatusCreated; j.Dependencies = nil })
	want := getJob(t, s, j.ID)
	steps := []struct {
		from []store.Status
		u    store.JobUpdate
		edit func(w *store.Job)
	}{
		{[]store.Status{store.StatusCreated}, store.JobUpdate{Status: store.StatusSkipped}, func(w *store.Job) { w.Status = store.StatusSkipped }},
		{[]store.Status{store.StatusSkipped}, store.JobUpdate{Status: store.StatusCreated}, func(w *store.Job) { w.Status = store.StatusCreated }},
		{[]store.Status{store.StatusCreated}, store.JobUpdate{Status: store.StatusScheduled, ScheduledAt: at(time.Hour)},
			func(w *store.Job) { w.Status, w.ScheduledAt = store.StatusScheduled, at(time.Hour) }},
		{[]store.Status{store.StatusScheduled}, store.JobUpdate{Status: store.StatusWaitingForResource},
			func(w *store.Job) { w.Status = store.StatusWaitingForResource }},
		{[]store.Status{store.StatusWaitingForResource}, store.JobUpdate{Status: store.StatusPending, Dependencies: []int64{3, 4}, QueuedAt: at(2 * time.Hour)},
			func(w *store.Job) {
				w.Status, w.Dependencies, w.QueuedAt = store.StatusPending, []int64{3, 4}, at(2*time.Hour)
			}},
		{[]store.Status{store.StatusPending}, store.JobUpdate{Status: store.StatusPending, Dependencies: []int64{}},
			func(w *store.Job) { w.Dependencies = nil }},
		{[]store.Status{store.StatusPending}, store.JobUpdate{Status: store.StatusFailed},
			func(w *store.Job) { w.Status = store.StatusFailed }},
	}
	for i, st := range steps {
		got, err := s.TransitionJob(ctx, j.ID, st.from, st.u)
		must(t, err)
		st.edit(want)
		check(t, "TransitionJob step "+string(rune('0'+i)), got, want)
	}
	if got := getJob(t, s, j.ID); !sameTime(got.QueuedSince(), at(2*time.Hour)) {
		t.Errorf("QueuedSince = %v, want QueuedAt %v", got.QueuedSince(), at(2*time.Hour))
	}
	if !store.StatusSkipped.Finished() || store.StatusManual.Finished() {
		t.Error("Finished: skipped must be final, manual not")
	}
	wantErr(t, "TouchJob(skipped job)", func() error {
		k := createJob(t, s, func(j *store.Job) { j.Status = store.StatusCreated })
		_, err := s.TransitionJob(ctx, k.ID, []store.Status{store.StatusCreated}, store.JobUpdate{Status: store.StatusSkipped})
		must(t, err)
		return s.TouchJob(ctx, k.ID, at(0))
	}(), store.ErrConflict)
}

func testCreateJobs(t *testing.T, s store.Store) {
	ctx := t.Context()
	a, b := newJob(), newJob()
	a.Status, b.Status = store.StatusCreated, ""
	must(t, s.CreateJobs(ctx, []*store.Job{a, b}))
	if a.ID <= 0 || b.ID <= a.ID {
		t.Errorf("CreateJobs IDs %d, %d: want increasing, in order", a.ID, b.ID)
	}
	if b.Status != store.StatusPending {
		t.Errorf("CreateJobs: empty status became %q, want pending", b.Status)
	}
	check(t, "CreateJobs first", getJob(t, s, a.ID), a)

	// All or none.
	c, d := newJob(), newJob()
	d.Status = store.StatusRunning
	if err := s.CreateJobs(ctx, []*store.Job{c, d}); err == nil {
		t.Error("CreateJobs with a running job succeeded, want an error")
	}
	all, err := s.ListJobs(ctx, store.JobFilter{})
	must(t, err)
	if len(all) != 2 {
		t.Errorf("jobs after a refused CreateJobs: %d, want 2", len(all))
	}
	must(t, s.CreateJobs(ctx, nil))
}

func testRetryJob(t *testing.T, s store.Store) {
	ctx := t.Context()
	old := createJob(t, s)
	next := newJob()
	wantErr(t, "RetryJob(pending job)", s.RetryJob(ctx, old.ID, next), store.ErrConflict)
	_, err := s.TransitionJob(ctx, old.ID, []store.Status{store.StatusPending}, store.JobUpdate{Status: store.StatusFailed})
	must(t, err)
	next.Status = store.StatusCreated
	must(t, s.RetryJob(ctx, old.ID, next))
	if next.ID <= old.ID {
		t.Errorf("RetryJob: new ID %d, want > %d", next.ID, old.ID)
	}
	if got := getJob(t, s, old.ID); !got.Retried || got.Status != store.StatusFailed {
		t.Errorf("old job after RetryJob: retried %v status %s, want retried failed", got.Retried, got.Status)
	}
	if got := getJob(t, s, next.ID); got.Retried || got.Status != store.StatusCreated {
		t.Errorf("new job: retried %v status %s, want not retried, created", got.Retried, got.Status)
	}
	// Exactly once: a second retry of the same job loses and inserts nothing.
	again := newJob()
	wantErr(t, "RetryJob(retried job)", s.RetryJob(ctx, old.ID, again), store.ErrConflict)
	wantErr(t, "RetryJob(missing job)", s.RetryJob(ctx, next.ID+100, newJob()), store.ErrNotFound)
	all, err := s.ListJobs(ctx, store.JobFilter{})
	must(t, err)
	if len(all) != 2 {
		t.Errorf("jobs after refused retries: %d, want 2", len(all))
	}
}

// testDownstreamPipelines: a pipeline records the upstream pipeline and
// bridge job that created it and the variables it was created with; the
// downstream pipelines of a pipeline, and of a bridge, are found by filter.
func testDownstreamPipelines(t *testing.T, s store.Store) {
	ctx := t.Context()
	a, b := createProject(t, s, "a"), createProject(t, s, "b")
	mk := func(p *store.Project, source string, upstream, job int64, vars []store.PipelineVariable) *store.Pipeline {
		pl := &store.Pipeline{ProjectID: p.ID, Ref: "main", Sha: "0123456789abcdef0123456789abcdef01234567",
			Source: source, UpstreamPipelineID: upstream, SourceJobID: job, Variables: vars, CreatedAt: at(0), UpdatedAt: at(0)}
		must(t, s.CreatePipeline(ctx, pl))
		return pl
	}
	root := mk(a, "push", 0, 0, []store.PipelineVariable{{Key: "K", Value: "v"}, {Key: "F", Value: "content", File: true}})
	bridge := &store.Job{Status: store.StatusCreated, ProjectID: a.ID, PipelineID: root.ID, Name: "child", CreatedAt: at(0)}
	must(t, s.CreateJob(ctx, bridge))
	other := &store.Job{Status: store.StatusCreated, ProjectID: a.ID, PipelineID: root.ID, Name: "deploy", CreatedAt: at(0)}
	must(t, s.CreateJob(ctx, other))
	child := mk(a, "parent_pipeline", root.ID, bridge.ID, []store.PipelineVariable{{Key: "FROM", Value: "bridge"}})
	multi := mk(b, "pipeline", root.ID, other.ID, nil)
	grandchild := mk(a, "parent_pipeline", child.ID, bridge.ID+100, nil)

	got, err := s.GetPipeline(ctx, root.ID)
	must(t, err)
	check(t, "GetPipeline(root, with variables)", got, root)
	got, err = s.GetPipeline(ctx, child.ID)
	must(t, err)
	check(t, "GetPipeline(child)", got, child)
	if got.UpstreamPipelineID != root.ID || got.SourceJobID != bridge.ID || len(got.Variables) != 1 {
		t.Errorf("child pipeline links %+v", got)
	}
	// The links survive an update.
	u, err := s.UpdatePipeline(ctx, child.ID, store.PipelineUpdate{Status: store.StatusRunning, UpdatedAt: at(time.Minute)})
	must(t, err)
	if u.UpstreamPipelineID != root.ID || u.SourceJobID != bridge.ID || len(u.Variables) != 1 {
		t.Errorf("UpdatePipeline lost the links: %+v", u)
	}

	list := func(f store.PipelineFilter) []int64 {
		t.Helper()
		ps, err := s.ListPipelines(ctx, f)
		must(t, err)
		var out []int64
		for _, p := range ps {
			out = append(out, p.ID)
		}
		return out
	}
	if got, want := list(store.PipelineFilter{UpstreamPipelineID: root.ID}), []int64{child.ID, multi.ID}; !slices.Equal(got, want) {
		t.Errorf("downstream of root = %v, want %v", got, want)
	}
	if got, want := list(store.PipelineFilter{UpstreamPipelineID: child.ID}), []int64{grandchild.ID}; !slices.Equal(got, want) {
		t.Errorf("downstream of child = %v, want %v", got, want)
	}
	if got, want := list(store.PipelineFilter{SourceJobID: bridge.ID}), []int64{child.ID}; !slices.Equal(got, want) {
		t.Errorf("downstream of bridge = %v, want %v", got, want)
	}
	if got, want := list(store.PipelineFilter{UpstreamPipelineID: root.ID, ProjectID: b.ID}), []int64{multi.ID}; !slices.Equal(got, want) {
		t.Errorf("downstream of root in b = %v, want %v", got, want)
	}
	if got := list(store.PipelineFilter{UpstreamPipelineID: grandchild.ID}); len(got) != 0 {
		t.Errorf("downstream of a leaf = %v, want none", got)
	}
}

func testDeletePipeline(t *testing.T, s store.Store) {
	ctx := t.Context()
	p := createProject(t, s, "del")
	mk := func() *store.Pipeline {
		pl := &store.Pipeline{ProjectID: p.ID, Ref: "main", Sha: "0123456789abcdef0123456789abcdef01234567", Source: "push", CreatedAt: at(0), UpdatedAt: at(0)}
		must(t, s.CreatePipeline(ctx, pl))
		return pl
	}
	gone, kept := mk(), mk()
	in := func(pl *store.Pipeline) func(*store.Job) {
		return func(j *store.Job) { j.ProjectID, j.PipelineID = p.ID, pl.ID }
	}
	a, b, c := createJob(t, s, in(gone)), createJob(t, s, in(gone)), createJob(t, s, in(kept))
	for _, j := range []*store.Job{a, c} {
		_, err := s.AppendTrace(ctx, j.ID, 0, []byte("log of a job\n"))
		must(t, err)
		_, err = s.PutArtifact(ctx, newArtifact(j.ID, "archive", time.Time{}))
		must(t, err)
	}
	e := &store.Environment{ProjectID: p.ID, Name: "production"}
	_, err := s.EnsureEnvironment(ctx, e)
	must(t, err)
	must(t, s.CreateDeployment(ctx, &store.Deployment{ProjectID: p.ID, EnvironmentID: e.ID, JobID: b.ID, PipelineID: gone.ID, Status: "success"}))
	site := &store.PagesDeployment{ProjectID: p.ID, JobID: a.ID, Dir: "site", CreatedAt: at(0)}
	_, err = s.PutPagesDeployment(ctx, site)
	must(t, err)

	wantErr(t, "DeletePipeline(missing)", s.DeletePipeline(ctx, kept.ID+100), store.ErrNotFound)
	must(t, s.DeletePipeline(ctx, gone.ID))
	wantErr(t, "DeletePipeline(again)", s.DeletePipeline(ctx, gone.ID), store.ErrNotFound)
	_, err = s.GetPipeline(ctx, gone.ID)
	wantErr(t, "GetPipeline(deleted)", err, store.ErrNotFound)
	for _, j := range []*store.Job{a, b} {
		_, err := s.GetJob(ctx, j.ID)
		wantErr(t, "GetJob(a deleted pipeline's)", err, store.ErrNotFound)
		arts, err := s.ListArtifacts(ctx, j.ID)
		if err != nil || len(arts) != 0 {
			t.Errorf("job %d of the deleted pipeline: artifacts %+v (%v)", j.ID, arts, err)
		}
		var buf bytes.Buffer
		if n, _ := s.ReadTrace(ctx, j.ID, 0, &buf); n != 0 {
			t.Errorf("job %d of the deleted pipeline: %d bytes of log still read", j.ID, n)
		}
	}
	if arts, err := s.ArtifactsOfType(ctx, "archive"); err != nil || len(arts) != 1 || arts[0].JobID != c.ID {
		t.Errorf("archives after the delete: %+v (%v), want job %d's alone", arts, err, c.ID)
	}
	if ds, err := s.ListDeployments(ctx, store.DeploymentFilter{ProjectID: p.ID}); err != nil || len(ds) != 0 {
		t.Errorf("deployments of the deleted pipeline's job: %+v (%v)", ds, err)
	}
	// The project's site outlives the job that deployed it.
	if list, err := s.ListPagesDeployments(ctx, p.ID); err != nil || len(list) != 1 || list[0].ID != site.ID {
		t.Errorf("pages deployments after the delete: %+v (%v), want the site", list, err)
	}
	// The other pipeline is whole.
	if _, err := s.GetPipeline(ctx, kept.ID); err != nil {
		t.Errorf("the other pipeline: %v", err)
	}
	if j := getJob(t, s, c.ID); j.PipelineID != kept.ID {
		t.Errorf("the other pipeline's job: %+v", j)
	}
	var buf bytes.Buffer
	if _, err := s.ReadTrace(ctx, c.ID, 0, &buf); err != nil || buf.String() != "log of a job\n" {
		t.Errorf("the other pipeline's log: %q (%v)", buf.String(), err)
	}
}
