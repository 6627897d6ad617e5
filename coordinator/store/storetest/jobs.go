package storetest

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/store"
)

// newJob returns a pending job with every enqueue-time field set.
func newJob() *store.Job {
	return &store.Job{
		Status:       store.StatusPending,
		ProjectID:    11,
		NamespaceID:  21,
		NamespaceIDs: []int64{21, 20, 1 << 33},
		PipelineID:   31,
		Name:         "test: [linux, 1.26]",
		Stage:        "test",
		Ref:          "refs/heads/main",
		Protected:    true,
		Tags:         []string{"docker", "linux"},
		Priority:     -3,
		Timeout:      3600,
		Spec:         []byte("{\"image\":\"golang\",\"bin\":\"\x00\xff\"}"),
		Dependencies: []int64{5, 6},
		Isolation:    "microvm",
		CreatedAt:    at(0),
		UpdatedAt:    at(0),
	}
}

func createJob(t testing.TB, s store.Store, edit ...func(j *store.Job)) *store.Job {
	t.Helper()
	j := newJob()
	for _, e := range edit {
		e(j)
	}
	must(t, s.CreateJob(t.Context(), j))
	return j
}

func getJob(t testing.TB, s store.Store, id int64) *store.Job {
	t.Helper()
	j, err := s.GetJob(t.Context(), id)
	must(t, err)
	return j
}

func testCreateJob(t *testing.T, s store.Store) {
	ctx := t.Context()
	tests := []struct {
		name string
		edit func(j *store.Job)
	}{
		{"all fields", func(j *store.Job) {}},
		{"empty slices and spec", func(j *store.Job) {
			j.NamespaceIDs, j.Tags, j.Spec, j.Dependencies = nil, nil, nil, nil
			j.Protected, j.Priority, j.Timeout, j.Isolation = false, 0, 0, ""
		}},
		{"high priority", func(j *store.Job) { j.Priority = 1 << 20; j.ProjectID = 12 }},
	}
	var lastID int64
	for _, tt := range tests {
		j := newJob()
		tt.edit(j)
		want := *j
		must(t, s.CreateJob(ctx, j))
		if j.ID <= lastID {
			t.Errorf("%s: ID %d, want > %d (increasing)", tt.name, j.ID, lastID)
		}
		lastID = j.ID
		want.ID = j.ID
		check(t, tt.name+": GetJob", getJob(t, s, j.ID), &want)
	}
	// A new job is not erased, whatever the caller's ErasedAt.
	j := createJob(t, s, func(j *store.Job) { j.ErasedAt = at(time.Hour) })
	if got := getJob(t, s, j.ID); !got.ErasedAt.IsZero() {
		t.Errorf("CreateJob stored ErasedAt %v, want none", got.ErasedAt)
	}
}

func testCreateJobStatus(t *testing.T, s store.Store) {
	ctx := t.Context()
	j := newJob()
	j.Status = ""
	must(t, s.CreateJob(ctx, j))
	if j.Status != store.StatusPending {
		t.Errorf("CreateJob with empty status: j.Status = %q, want pending", j.Status)
	}
	if got := getJob(t, s, j.ID); got.Status != store.StatusPending {
		t.Errorf("stored status %q, want pending", got.Status)
	}
	for _, st := range []store.Status{store.StatusRunning, store.StatusSuccess, store.StatusCanceled, "bogus"} {
		j := newJob()
		j.Status = st
		if err := s.CreateJob(ctx, j); err == nil {
			t.Errorf("CreateJob(status %q) succeeded, want an error", st)
		}
	}
	all, err := s.ListJobs(ctx, store.JobFilter{})
	must(t, err)
	if len(all) != 1 {
		t.Errorf("jobs after rejected creates: %d, want 1", len(all))
	}
}

func testJobNotFound(t *testing.T, s store.Store) {
	ctx := t.Context()
	j := createJob(t, s)
	for _, id := range []int64{j.ID + 1, 0, -5} {
		_, err := s.GetJob(ctx, id)
		wantErr(t, "GetJob(missing)", err, store.ErrNotFound)
		err = s.AssignJob(ctx, store.Assignment{JobID: id, RunnerID: 1, ManagerID: 1, TokenDigest: digest(t), At: at(0)})
		wantErr(t, "AssignJob(missing)", err, store.ErrNotFound)
		wantErr(t, "UnassignJob(missing)", s.UnassignJob(ctx, id, 1), store.ErrConflict)
		_, err = s.TransitionJob(ctx, id, []store.Status{store.StatusPending}, store.JobUpdate{Status: store.StatusCanceled})
		wantErr(t, "TransitionJob(missing)", err, store.ErrNotFound)
		wantErr(t, "TouchJob(missing)", s.TouchJob(ctx, id, at(0)), store.ErrNotFound)
	}
}

func testListJobs(t *testing.T, s store.Store) {
	ctx := t.Context()
	all, err := s.ListJobs(ctx, store.JobFilter{})
	must(t, err)
	if len(all) != 0 {
		t.Fatalf("ListJobs on empty store: %d jobs", len(all))
	}

	// Jobs in projects 1 and 2, pipelines 10 and 20, updated at
	// increasing times; some moved to running or canceled.
	var jobs []*store.Job
	for i := range 8 {
		jobs = append(jobs, createJob(t, s, func(j *store.Job) {
			j.ProjectID = int64(1 + i%2)
			j.PipelineID = int64(10 * (1 + i/4))
			j.UpdatedAt = at(time.Duration(i) * time.Minute)
			// Priority must not affect ListJobs' order.
			j.Priority = 8 - i
		}))
	}
	run := func(j *store.Job) {
		must(t, s.AssignJob(ctx, store.Assignment{JobID: j.ID, RunnerID: 1, ManagerID: 1, TokenDigest: digest(t), At: j.UpdatedAt}))
		_, err := s.TransitionJob(ctx, j.ID, []store.Status{store.StatusPending}, store.JobUpdate{Status: store.StatusRunning})
		must(t, err)
	}
	run(jobs[1])
	run(jobs[4])
	_, err = s.TransitionJob(ctx, jobs[6].ID, []store.Status{store.StatusPending}, store.JobUpdate{Status: store.StatusCanceled})
	must(t, err)

	ids := func(idx ...int) []int64 {
		var out []int64
		for _, i := range idx {
			out = append(out, jobs[i].ID)
		}
		return out
	}
	tests := []struct {
		name string
		f    store.JobFilter
		want []int64
	}{
		{"all", store.JobFilter{}, ids(0, 1, 2, 3, 4, 5, 6, 7)},
		{"limit", store.JobFilter{Limit: 3}, ids(0, 1, 2)},
		{"negative limit", store.JobFilter{Limit: -1}, ids(0, 1, 2, 3, 4, 5, 6, 7)},
		{"pending", store.JobFilter{Statuses: []store.Status{store.StatusPending}}, ids(0, 2, 3, 5, 7)},
		{"running or canceled", store.JobFilter{Statuses: []store.Status{store.StatusCanceled, store.StatusRunning}}, ids(1, 4, 6)},
		{"success", store.JobFilter{Statuses: []store.Status{store.StatusSuccess}}, nil},
		{"project 2", store.JobFilter{ProjectID: 2}, ids(1, 3, 5, 7)},
		{"pipeline 20", store.JobFilter{PipelineID: 20}, ids(4, 5, 6, 7)},
		{"project 1, pipeline 20", store.JobFilter{ProjectID: 1, PipelineID: 20}, ids(4, 6)},
		{"runner 1", store.JobFilter{RunnerID: 1}, ids(1, 4)},
		{"runner 1, pipeline 20", store.JobFilter{RunnerID: 1, PipelineID: 20}, ids(4)},
		{"runner 2", store.JobFilter{RunnerID: 2}, nil},
		{"updated before 3m", store.JobFilter{UpdatedBefore: at(3 * time.Minute)}, ids(0, 1, 2)},
		{"updated before 3m+1µs", store.JobFilter{UpdatedBefore: at(3*time.Minute + time.Microsecond)}, ids(0, 1, 2, 3)},
		{"pending, updated before 6m, limit 2", store.JobFilter{Statuses: []store.Status{store.StatusPending}, UpdatedBefore: at(6 * time.Minute), Limit: 2}, ids(0, 2)},
		{"missing project", store.JobFilter{ProjectID: 3}, nil},
		{"ids", store.JobFilter{IDs: ids(5, 0, 3)}, ids(0, 3, 5)},
		{"ids, pending", store.JobFilter{IDs: ids(1, 2, 4, 6), Statuses: []store.Status{store.StatusPending}}, ids(2)},
		{"ids, one missing", store.JobFilter{IDs: append(ids(7), 1<<40)}, ids(7)},
	}
	for _, tt := range tests {
		got, err := s.ListJobs(ctx, tt.f)
		must(t, err)
		var gotIDs []int64
		for _, j := range got {
			gotIDs = append(gotIDs, j.ID)
		}
		if !slices.Equal(gotIDs, tt.want) {
			t.Errorf("ListJobs(%s) = %v, want %v", tt.name, gotIDs, tt.want)
		}
	}

	// Listed jobs are complete.
	got, err := s.ListJobs(ctx, store.JobFilter{ProjectID: 1, Limit: 1})
	must(t, err)
	if len(got) == 1 {
		check(t, "ListJobs element", got[0], jobs[0])
	}
}

func testAssignJob(t *testing.T, s store.Store) {
	ctx := t.Context()
	j := createJob(t, s)
	a := store.Assignment{JobID: j.ID, RunnerID: 7, ManagerID: 8, TokenDigest: digest(t), At: at(time.Minute)}
	must(t, s.AssignJob(ctx, a))

	want := *j
	want.RunnerID, want.RunnerManagerID, want.TokenDigest = a.RunnerID, a.ManagerID, a.TokenDigest
	want.AssignedAt, want.UpdatedAt = a.At, a.At
	check(t, "job after AssignJob", getJob(t, s, j.ID), &want)

	// Exactly once: a second assignment, even by the same manager, loses.
	b := store.Assignment{JobID: j.ID, RunnerID: 9, ManagerID: 10, TokenDigest: digest(t), At: at(2 * time.Minute)}
	wantErr(t, "second AssignJob", s.AssignJob(ctx, b), store.ErrConflict)
	wantErr(t, "AssignJob again by same manager", s.AssignJob(ctx, a), store.ErrConflict)
	check(t, "job after lost AssignJob", getJob(t, s, j.ID), &want)

	// Only pending jobs can be assigned.
	for _, st := range []store.Status{store.StatusCanceled} {
		k := createJob(t, s)
		_, err := s.TransitionJob(ctx, k.ID, []store.Status{store.StatusPending}, store.JobUpdate{Status: st})
		must(t, err)
		err = s.AssignJob(ctx, store.Assignment{JobID: k.ID, RunnerID: 1, ManagerID: 1, TokenDigest: digest(t), At: at(0)})
		wantErr(t, "AssignJob("+string(st)+" job)", err, store.ErrConflict)
	}
	k := createJob(t, s)
	must(t, s.AssignJob(ctx, store.Assignment{JobID: k.ID, RunnerID: 1, ManagerID: 1, TokenDigest: digest(t), At: at(0)}))
	_, err := s.TransitionJob(ctx, k.ID, []store.Status{store.StatusPending}, store.JobUpdate{Status: store.StatusRunning})
	must(t, err)
	err = s.AssignJob(ctx, store.Assignment{JobID: k.ID, RunnerID: 2, ManagerID: 2, TokenDigest: digest(t), At: at(0)})
	wantErr(t, "AssignJob(running job)", err, store.ErrConflict)
}

// testTransitionAssign: a job can enter the queue already handed out (a
// runner was waiting): the transition writes the assignment as AssignJob
// would, its token finds it, and it cannot be assigned again.
func testTransitionAssign(t *testing.T, s store.Store) {
	ctx := t.Context()
	j := createJob(t, s, func(j *store.Job) { j.Status = store.StatusCreated })
	a := store.Assignment{RunnerID: 7, ManagerID: 8, TokenDigest: digest(t), At: at(time.Minute)}
	got, err := s.TransitionJob(ctx, j.ID, []store.Status{store.StatusCreated},
		store.JobUpdate{Status: store.StatusPending, QueuedAt: a.At, UpdatedAt: a.At, Assign: &a})
	must(t, err)
	want := *j
	want.Status, want.QueuedAt, want.UpdatedAt = store.StatusPending, a.At, a.At
	want.RunnerID, want.RunnerManagerID, want.TokenDigest, want.AssignedAt = a.RunnerID, a.ManagerID, a.TokenDigest, a.At
	check(t, "job returned by an assigning TransitionJob", got, &want)
	check(t, "job after an assigning TransitionJob", getJob(t, s, j.ID), &want)
	byToken, err := s.JobByTokenDigest(ctx, a.TokenDigest)
	must(t, err)
	if byToken.ID != j.ID {
		t.Errorf("JobByTokenDigest found job %d, want %d", byToken.ID, j.ID)
	}
	err = s.AssignJob(ctx, store.Assignment{JobID: j.ID, RunnerID: 9, ManagerID: 10, TokenDigest: digest(t), At: at(2 * time.Minute)})
	wantErr(t, "AssignJob of a job stored assigned", err, store.ErrConflict)
	// Manager 0 would leave it looking queued: refused, nothing written.
	k := createJob(t, s, func(j *store.Job) { j.Status = store.StatusCreated })
	_, err = s.TransitionJob(ctx, k.ID, []store.Status{store.StatusCreated},
		store.JobUpdate{Status: store.StatusPending, Assign: &store.Assignment{RunnerID: 1, TokenDigest: digest(t), At: at(0)}})
	if err == nil {
		t.Error("TransitionJob assigning to manager 0: no error")
	}
	check(t, "job after a refused assigning TransitionJob", getJob(t, s, k.ID), k)
}

func testUnassignJob(t *testing.T, s store.Store) {
	ctx := t.Context()
	j := createJob(t, s)
	wantErr(t, "UnassignJob(unassigned job)", s.UnassignJob(ctx, j.ID, 8), store.ErrConflict)

	a := store.Assignment{JobID: j.ID, RunnerID: 7, ManagerID: 8, TokenDigest: digest(t), At: at(time.Minute)}
	must(t, s.AssignJob(ctx, a))
	wantErr(t, "UnassignJob(other manager)", s.UnassignJob(ctx, j.ID, 9), store.ErrConflict)
	must(t, s.UnassignJob(ctx, j.ID, 8))

	want := *j
	want.UpdatedAt = a.At // set by AssignJob, left by UnassignJob
	check(t, "job after UnassignJob", getJob(t, s, j.ID), &want)
	_, err := s.JobByTokenDigest(ctx, a.TokenDigest)
	wantErr(t, "JobByTokenDigest(token of undone assignment)", err, store.ErrNotFound)
	wantErr(t, "UnassignJob twice", s.UnassignJob(ctx, j.ID, 8), store.ErrConflict)

	// Back in the queue: it can be assigned again.
	b := store.Assignment{JobID: j.ID, RunnerID: 7, ManagerID: 9, TokenDigest: digest(t), At: at(2 * time.Minute)}
	must(t, s.AssignJob(ctx, b))

	// Once acked (running) the assignment stays.
	_, err = s.TransitionJob(ctx, j.ID, []store.Status{store.StatusPending}, store.JobUpdate{Status: store.StatusRunning})
	must(t, err)
	wantErr(t, "UnassignJob(running job)", s.UnassignJob(ctx, j.ID, 9), store.ErrConflict)
	if got := getJob(t, s, j.ID); got.RunnerManagerID != 9 || got.TokenDigest != b.TokenDigest {
		t.Errorf("running job after refused unassign: manager %d token %q, want 9 %q", got.RunnerManagerID, got.TokenDigest, b.TokenDigest)
	}
}

func testTransitionJob(t *testing.T, s store.Store) {
	ctx := t.Context()
	pending := []store.Status{store.StatusPending}
	running := []store.Status{store.StatusRunning}
	active := []store.Status{store.StatusPending, store.StatusRunning, store.StatusCanceling}

	// Each step applies to the status left by the previous one.
	steps := []struct {
		from    []store.Status
		to      store.Status
		wantErr error
	}{
		{running, store.StatusSuccess, store.ErrConflict},
		{nil, store.StatusRunning, store.ErrConflict},
		{pending, store.StatusRunning, nil},
		{pending, store.StatusRunning, store.ErrConflict},
		{active, store.StatusCanceling, nil},
		{running, store.StatusCanceled, store.ErrConflict},
		{[]store.Status{store.StatusCanceling}, store.StatusCanceled, nil},
		{active, store.StatusFailed, store.ErrConflict},
		{[]store.Status{store.StatusCanceled}, store.StatusCanceled, nil}, // idempotent final update
	}
	j := createJob(t, s)
	status := store.StatusPending
	for i, st := range steps {
		got, err := s.TransitionJob(ctx, j.ID, st.from, store.JobUpdate{Status: st.to})
		if st.wantErr != nil {
			wantErr(t, "step "+string(rune('0'+i))+": TransitionJob", err, st.wantErr)
			if got != nil {
				t.Errorf("step %d: TransitionJob returned a job with an error", i)
			}
		} else {
			if err != nil {
				t.Fatalf("step %d: TransitionJob(%v → %s): %v", i, st.from, st.to, err)
			}
			status = st.to
			if got == nil || got.Status != status || got.ID != j.ID {
				t.Fatalf("step %d: TransitionJob returned %+v, want job %d with status %s", i, got, j.ID, status)
			}
		}
		if cur := getJob(t, s, j.ID).Status; cur != status {
			t.Fatalf("step %d: status %s, want %s", i, cur, status)
		}
	}
}

// testTransitionJobIfTokenDigest: an acknowledgement names its
// hand-out's token digest and applies to no other hand-out of the job.
func testTransitionJobIfTokenDigest(t *testing.T, s store.Store) {
	ctx := t.Context()
	pending := []store.Status{store.StatusPending}
	j := createJob(t, s)
	first, second := digest(t), digest(t)
	ackOf := func(d string) (*store.Job, error) {
		return s.TransitionJob(ctx, j.ID, pending, store.JobUpdate{Status: store.StatusRunning, StartedAt: at(time.Hour), UpdatedAt: at(time.Hour), IfTokenDigest: d})
	}
	_, err := ackOf(first)
	wantErr(t, "acknowledgement of a job not handed out", err, store.ErrConflict)
	must(t, s.AssignJob(ctx, store.Assignment{JobID: j.ID, RunnerID: 7, ManagerID: 8, TokenDigest: first, At: at(time.Minute)}))
	must(t, s.UnassignJob(ctx, j.ID, 8))
	must(t, s.AssignJob(ctx, store.Assignment{JobID: j.ID, RunnerID: 7, ManagerID: 9, TokenDigest: second, At: at(2 * time.Minute)}))
	_, err = ackOf(first)
	wantErr(t, "acknowledgement of the first hand-out after a second", err, store.ErrConflict)
	if got := getJob(t, s, j.ID); got.Status != store.StatusPending || !got.StartedAt.IsZero() {
		t.Fatalf("job after a stale acknowledgement: %s, started %v", got.Status, got.StartedAt)
	}
	got, err := ackOf(second)
	must(t, err)
	if got.Status != store.StatusRunning || got.TokenDigest != second || got.StartedAt.Sub(at(time.Hour)).Abs() >= time.Microsecond {
		t.Fatalf("acknowledged job: %s, digest %q, started %v", got.Status, got.TokenDigest, got.StartedAt)
	}
}

func testTransitionJobFields(t *testing.T, s store.Store) {
	ctx := t.Context()
	j := createJob(t, s)
	a := store.Assignment{JobID: j.ID, RunnerID: 7, ManagerID: 8, TokenDigest: digest(t), At: at(time.Minute)}
	must(t, s.AssignJob(ctx, a))
	want := *j
	want.RunnerID, want.RunnerManagerID, want.TokenDigest, want.AssignedAt = 7, 8, a.TokenDigest, a.At
	want.UpdatedAt = a.At

	updates := []struct {
		from []store.Status
		u    store.JobUpdate
		edit func(w *store.Job)
	}{
		{[]store.Status{store.StatusPending}, store.JobUpdate{Status: store.StatusRunning, StartedAt: at(2 * time.Minute), UpdatedAt: at(2 * time.Minute)},
			func(w *store.Job) {
				w.Status, w.StartedAt, w.UpdatedAt = store.StatusRunning, at(2*time.Minute), at(2*time.Minute)
			}},
		// Zero fields leave values alone.
		{[]store.Status{store.StatusRunning}, store.JobUpdate{Status: store.StatusRunning},
			func(w *store.Job) {}},
		{[]store.Status{store.StatusRunning}, store.JobUpdate{Status: store.StatusFailed, FailureReason: "script_failure", ExitCode: 137, FinishedAt: at(3 * time.Minute), UpdatedAt: at(3 * time.Minute)},
			func(w *store.Job) {
				w.Status, w.FailureReason, w.ExitCode = store.StatusFailed, "script_failure", 137
				w.FinishedAt, w.UpdatedAt = at(3*time.Minute), at(3*time.Minute)
			}},
		{[]store.Status{store.StatusFailed}, store.JobUpdate{Status: store.StatusFailed, UpdatedAt: at(4 * time.Minute)},
			func(w *store.Job) { w.UpdatedAt = at(4 * time.Minute) }},
		// An erase sets ErasedAt alone; a later update leaves it.
		{[]store.Status{store.StatusFailed}, store.JobUpdate{Status: store.StatusFailed, ErasedAt: at(5 * time.Minute)},
			func(w *store.Job) { w.ErasedAt = at(5 * time.Minute) }},
		{[]store.Status{store.StatusFailed}, store.JobUpdate{Status: store.StatusFailed, UpdatedAt: at(6 * time.Minute)},
			func(w *store.Job) { w.UpdatedAt = at(6 * time.Minute) }},
	}
	for i, u := range updates {
		got, err := s.TransitionJob(ctx, j.ID, u.from, u.u)
		must(t, err)
		u.edit(&want)
		check(t, "TransitionJob result "+string(rune('0'+i)), got, &want)
		check(t, "GetJob after TransitionJob "+string(rune('0'+i)), getJob(t, s, j.ID), &want)
	}
	// A refused transition changes nothing.
	_, err := s.TransitionJob(ctx, j.ID, []store.Status{store.StatusRunning}, store.JobUpdate{Status: store.StatusSuccess, ExitCode: 1, UpdatedAt: at(time.Hour)})
	wantErr(t, "TransitionJob(failed job from running)", err, store.ErrConflict)
	check(t, "job after refused TransitionJob", getJob(t, s, j.ID), &want)
}

func testTouchJob(t *testing.T, s store.Store) {
	ctx := t.Context()
	j := createJob(t, s)
	must(t, s.TouchJob(ctx, j.ID, at(time.Minute)))
	if got := getJob(t, s, j.ID); !sameTime(got.UpdatedAt, at(time.Minute)) {
		t.Errorf("UpdatedAt after TouchJob = %v, want %v", got.UpdatedAt, at(time.Minute))
	}
	for _, st := range []store.Status{store.StatusRunning, store.StatusCanceling} {
		_, err := s.TransitionJob(ctx, j.ID, []store.Status{store.StatusPending, store.StatusRunning}, store.JobUpdate{Status: st})
		must(t, err)
		must(t, s.TouchJob(ctx, j.ID, at(2*time.Minute)))
	}
	_, err := s.TransitionJob(ctx, j.ID, []store.Status{store.StatusCanceling}, store.JobUpdate{Status: store.StatusCanceled, UpdatedAt: at(3 * time.Minute)})
	must(t, err)
	wantErr(t, "TouchJob(finished job)", s.TouchJob(ctx, j.ID, at(4*time.Minute)), store.ErrConflict)
	if got := getJob(t, s, j.ID); !sameTime(got.UpdatedAt, at(3*time.Minute)) {
		t.Errorf("UpdatedAt after refused TouchJob = %v, want %v", got.UpdatedAt, at(3*time.Minute))
	}
	for _, st := range []store.Status{store.StatusSuccess, store.StatusFailed} {
		k := createJob(t, s)
		_, err := s.TransitionJob(ctx, k.ID, []store.Status{store.StatusPending}, store.JobUpdate{Status: st})
		must(t, err)
		wantErr(t, "TouchJob("+string(st)+" job)", s.TouchJob(ctx, k.ID, at(0)), store.ErrConflict)
	}
}

func testMarkDebugTrace(t *testing.T, s store.Store) {
	ctx := t.Context()
	j := createJob(t, s)
	other := createJob(t, s)
	if getJob(t, s, j.ID).DebugTrace {
		t.Fatal("a new job's log is a debug trace")
	}
	must(t, s.MarkDebugTrace(ctx, j.ID))
	must(t, s.MarkDebugTrace(ctx, j.ID)) // again: nothing changes
	if !getJob(t, s, j.ID).DebugTrace || getJob(t, s, other.ID).DebugTrace {
		t.Error("MarkDebugTrace marked the wrong job")
	}
	// The mark stays through the job's end and its listing.
	_, err := s.TransitionJob(ctx, j.ID, []store.Status{store.StatusPending}, store.JobUpdate{Status: store.StatusFailed})
	must(t, err)
	if !getJob(t, s, j.ID).DebugTrace {
		t.Error("a finished job lost its debug trace mark")
	}
	wantErr(t, "MarkDebugTrace(missing)", s.MarkDebugTrace(ctx, other.ID+1000), store.ErrNotFound)
}

func testJobByTokenDigest(t *testing.T, s store.Store) {
	ctx := t.Context()
	j := createJob(t, s)
	createJob(t, s) // unassigned: empty digest must not match
	_, err := s.JobByTokenDigest(ctx, "")
	wantErr(t, "JobByTokenDigest(\"\")", err, store.ErrNotFound)
	_, err = s.JobByTokenDigest(ctx, digest(t))
	wantErr(t, "JobByTokenDigest(missing)", err, store.ErrNotFound)

	a := store.Assignment{JobID: j.ID, RunnerID: 7, ManagerID: 8, TokenDigest: digest(t), At: at(time.Minute)}
	must(t, s.AssignJob(ctx, a))
	for _, st := range []store.Status{store.StatusRunning, store.StatusSuccess} {
		_, err := s.TransitionJob(ctx, j.ID, []store.Status{store.StatusPending, store.StatusRunning}, store.JobUpdate{Status: st})
		must(t, err)
		got, err := s.JobByTokenDigest(ctx, a.TokenDigest)
		must(t, err)
		if got.ID != j.ID || got.Status != st {
			t.Errorf("JobByTokenDigest for %s job: got job %d status %s, want %d %s", st, got.ID, got.Status, j.ID, st)
		}
	}
}

// testTimeRoundTrip checks times far from now, in odd zones, with
// sub-microsecond parts.
func testTimeRoundTrip(t *testing.T, s store.Store) {
	ctx := t.Context()
	times := []time.Time{
		time.Date(1, 1, 1, 0, 0, 0, 1000, time.UTC), // just after the zero time
		time.Date(1969, 12, 31, 23, 59, 59, 999999999, time.UTC),
		time.Unix(0, 0),
		time.Unix(0, 1000).In(time.FixedZone("west", -11*3600)),
		time.Date(2038, 1, 19, 3, 14, 8, 123456789, time.FixedZone("east", 14*3600)),
		time.Date(9999, 12, 31, 23, 59, 59, 999999000, time.UTC),
	}
	for _, tm := range times {
		j := createJob(t, s, func(j *store.Job) { j.CreatedAt, j.UpdatedAt = tm, tm })
		got := getJob(t, s, j.ID)
		if !sameTime(got.CreatedAt, tm) || !sameTime(got.UpdatedAt, tm) {
			t.Errorf("time %v came back as %v / %v", tm, got.CreatedAt, got.UpdatedAt)
		}
		list, err := s.ListJobs(ctx, store.JobFilter{UpdatedBefore: tm.Add(time.Microsecond)})
		must(t, err)
		if !slices.ContainsFunc(list, func(x *store.Job) bool { return x.ID == j.ID }) {
			t.Errorf("ListJobs(UpdatedBefore %v) misses a job updated at %v", tm.Add(time.Microsecond), tm)
		}
	}
}

// testCopiesAreFresh checks that returned structs are not shared.
func testCopiesAreFresh(t *testing.T, s store.Store) {
	ctx := t.Context()
	j := createJob(t, s)
	j.Tags[0] = "mutated after create"
	j.Spec[0] = 'X'
	g1 := getJob(t, s, j.ID)
	if g1.Tags[0] != "docker" || g1.Spec[0] != '{' {
		t.Errorf("store kept the caller's slices: tags %v spec %q", g1.Tags, g1.Spec)
	}
	g1.Tags[0], g1.Name = "mutated", "mutated"
	g2 := getJob(t, s, j.ID)
	if g2.Tags[0] != "docker" || g2.Name == "mutated" {
		t.Errorf("GetJob returned shared state: %+v", g2)
	}
	r := createRunner(t, s)
	r.Tags[0] = "mutated"
	got, err := s.GetRunner(ctx, r.ID)
	must(t, err)
	if got.Tags[0] == "mutated" {
		t.Errorf("store kept the caller's runner tags")
	}
}

// testNilInputs checks that nil pointers and writers are errors.
func testNilInputs(t *testing.T, s store.Store) {
	ctx := t.Context()
	checks := map[string]func() error{
		"CreateRunner(nil)":        func() error { return s.CreateRunner(ctx, nil) },
		"UpdateRunner(nil)":        func() error { return s.UpdateRunner(ctx, nil) },
		"UpsertRunnerManager(nil)": func() error { return s.UpsertRunnerManager(ctx, nil) },
		"CreateJob(nil)":           func() error { return s.CreateJob(ctx, nil) },
		"PutArtifact(nil)":         func() error { _, err := s.PutArtifact(ctx, nil); return err },
		"CreateJobs(nil element)":  func() error { return s.CreateJobs(ctx, []*store.Job{newJob(), nil}) },
		"RetryJob(nil)":            func() error { return s.RetryJob(ctx, 1, nil) },
		"CreateProject(nil)":       func() error { return s.CreateProject(ctx, nil) },
		"UpdateProject(nil)":       func() error { return s.UpdateProject(ctx, nil) },
		"CreatePipeline(nil)":      func() error { return s.CreatePipeline(ctx, nil) },
		"CreateVariable(nil)":      func() error { return s.CreateVariable(ctx, nil) },
		"UpdateVariable(nil)":      func() error { return s.UpdateVariable(ctx, nil) },
		// Manager 0 means "not handed out": accepting it would let the
		// job be handed out twice.
		"AssignJob(manager 0)": func() error {
			j := createJob(t, s)
			return s.AssignJob(ctx, store.Assignment{JobID: j.ID, RunnerID: 1, TokenDigest: digest(t), At: at(0)})
		},
		"ReadTrace(nil writer)": func() error {
			j := createJob(t, s)
			if _, err := s.AppendTrace(ctx, j.ID, 0, []byte("x")); err != nil {
				return nil // reported elsewhere; make this check fail
			}
			_, err := s.ReadTrace(ctx, j.ID, 0, nil)
			return err
		},
	}
	for name, fn := range checks {
		if err := fn(); err == nil {
			t.Errorf("%s: no error", name)
		} else if errors.Is(err, store.ErrConflict) {
			t.Errorf("%s: %v, want an argument error, not a conflict", name, err)
		}
	}
}
