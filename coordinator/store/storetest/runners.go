package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/store"
)

func testSettings(t *testing.T, s store.Store) {
	ctx := t.Context()
	_, err := s.GetSetting(ctx, "admin_token_digest")
	wantErr(t, "GetSetting(missing)", err, store.ErrNotFound)

	tests := []struct{ key, value string }{
		{"admin_token_digest", "abc"},
		{"admin_token_digest", "def"}, // overwrite
		{"empty", ""},
		{"unicode ☃", "välue\nwith newline"},
	}
	for _, tt := range tests {
		must(t, s.PutSetting(ctx, tt.key, tt.value))
		got, err := s.GetSetting(ctx, tt.key)
		must(t, err)
		if got != tt.value {
			t.Errorf("GetSetting(%q) = %q, want %q", tt.key, got, tt.value)
		}
	}
	got, err := s.GetSetting(ctx, "admin_token_digest")
	must(t, err)
	if got != "def" {
		t.Errorf("GetSetting after overwrite = %q, want def", got)
	}
}

func testRegistrationTokens(t *testing.T, s store.Store) {
	ctx := t.Context()
	_, err := s.RegistrationTokenByDigest(ctx, digest(t))
	wantErr(t, "RegistrationTokenByDigest(missing)", err, store.ErrNotFound)
	_, err = s.RegistrationTokenByDigest(ctx, "")
	wantErr(t, "RegistrationTokenByDigest(\"\")", err, store.ErrNotFound)

	inst1 := store.RegistrationToken{Digest: digest(t), Scope: store.InstanceType, CreatedAt: at(0)}
	group1 := store.RegistrationToken{Digest: digest(t), Scope: store.GroupType, ScopeID: 7, CreatedAt: at(time.Second)}
	group2 := store.RegistrationToken{Digest: digest(t), Scope: store.GroupType, ScopeID: 8, CreatedAt: at(2 * time.Second)}
	proj := store.RegistrationToken{Digest: digest(t), Scope: store.ProjectType, ScopeID: 7, CreatedAt: at(3 * time.Second)}
	for _, tok := range []store.RegistrationToken{inst1, group1, group2, proj} {
		must(t, s.PutRegistrationToken(ctx, tok))
	}
	for _, tok := range []store.RegistrationToken{inst1, group1, group2, proj} {
		got, err := s.RegistrationTokenByDigest(ctx, tok.Digest)
		must(t, err)
		check(t, "RegistrationTokenByDigest", got, &tok)
	}

	// Replacing the token of a scope drops the old digest and leaves the
	// other scopes alone.
	inst2 := store.RegistrationToken{Digest: digest(t), Scope: store.InstanceType, CreatedAt: at(time.Hour)}
	must(t, s.PutRegistrationToken(ctx, inst2))
	_, err = s.RegistrationTokenByDigest(ctx, inst1.Digest)
	wantErr(t, "old instance token after replace", err, store.ErrNotFound)
	got, err := s.RegistrationTokenByDigest(ctx, inst2.Digest)
	must(t, err)
	check(t, "new instance token", got, &inst2)

	group1b := store.RegistrationToken{Digest: digest(t), Scope: store.GroupType, ScopeID: 7, CreatedAt: at(time.Hour)}
	must(t, s.PutRegistrationToken(ctx, group1b))
	_, err = s.RegistrationTokenByDigest(ctx, group1.Digest)
	wantErr(t, "old group 7 token after replace", err, store.ErrNotFound)
	for _, tok := range []store.RegistrationToken{group1b, group2, proj} {
		got, err := s.RegistrationTokenByDigest(ctx, tok.Digest)
		must(t, err)
		check(t, "token of other scope after replace", got, &tok)
	}
}

// newRunner returns a runner with every field set.
func newRunner(t testing.TB) *store.Runner {
	return &store.Runner{
		Type:            store.ProjectType,
		GroupID:         0,
		ProjectIDs:      []int64{3, 1 << 40, 5},
		Description:     "runner “one”",
		MaintenanceNote: "note",
		Tags:            []string{"docker", "linux", "x86 64"},
		RunUntagged:     true,
		Locked:          true,
		Paused:          false,
		AccessLevel:     store.RefProtected,
		MaximumTimeout:  3600,
		Legacy:          true,
		TokenDigest:     digest(t),
		TokenObtainedAt: at(0),
		TokenExpiresAt:  at(24 * time.Hour),
		CreatedAt:       at(0),
		ContactedAt:     at(time.Minute),
	}
}

func createRunner(t testing.TB, s store.Store) *store.Runner {
	t.Helper()
	r := newRunner(t)
	must(t, s.CreateRunner(t.Context(), r))
	return r
}

func testRunnerRoundTrip(t *testing.T, s store.Store) {
	ctx := t.Context()
	tests := []struct {
		name string
		edit func(r *store.Runner)
	}{
		{"all fields", func(r *store.Runner) {}},
		{"instance, zero times and slices", func(r *store.Runner) {
			r.Type, r.ProjectIDs, r.Tags = store.InstanceType, nil, nil
			r.TokenExpiresAt, r.ContactedAt = time.Time{}, time.Time{}
			r.AccessLevel, r.Legacy, r.Locked, r.RunUntagged = store.NotProtected, false, false, false
		}},
		{"group, paused", func(r *store.Runner) {
			r.Type, r.GroupID, r.ProjectIDs, r.Paused = store.GroupType, 42, nil, true
			r.Tags = []string{"a"}
		}},
	}
	var lastID int64
	for _, tt := range tests {
		r := newRunner(t)
		tt.edit(r)
		want := *r
		must(t, s.CreateRunner(ctx, r))
		if r.ID <= lastID {
			t.Errorf("%s: CreateRunner set ID %d, want > %d", tt.name, r.ID, lastID)
		}
		lastID = r.ID
		want.ID = r.ID
		got, err := s.GetRunner(ctx, r.ID)
		must(t, err)
		check(t, tt.name+": GetRunner", got, &want)
		got, err = s.RunnerByTokenDigest(ctx, r.TokenDigest)
		must(t, err)
		check(t, tt.name+": RunnerByTokenDigest", got, &want)
	}
}

func testRunnerTokenDigestUnique(t *testing.T, s store.Store) {
	ctx := t.Context()
	r1 := createRunner(t, s)
	r2 := newRunner(t)
	r2.TokenDigest = r1.TokenDigest
	wantErr(t, "CreateRunner(duplicate digest)", s.CreateRunner(ctx, r2), store.ErrExists)
	list, err := s.ListRunners(ctx)
	must(t, err)
	if len(list) != 1 {
		t.Errorf("ListRunners after failed create: %d runners, want 1", len(list))
	}
}

func testRunnerNotFound(t *testing.T, s store.Store) {
	ctx := t.Context()
	r := createRunner(t, s)
	for _, id := range []int64{r.ID + 1, 0, -1} {
		_, err := s.GetRunner(ctx, id)
		wantErr(t, "GetRunner(missing)", err, store.ErrNotFound)
	}
	_, err := s.RunnerByTokenDigest(ctx, digest(t))
	wantErr(t, "RunnerByTokenDigest(missing)", err, store.ErrNotFound)
	_, err = s.RunnerByTokenDigest(ctx, "")
	wantErr(t, "RunnerByTokenDigest(\"\")", err, store.ErrNotFound)
	wantErr(t, "DeleteRunner(missing)", s.DeleteRunner(ctx, r.ID+1), store.ErrNotFound)
	missing := newRunner(t)
	missing.ID = r.ID + 1
	wantErr(t, "UpdateRunner(missing)", s.UpdateRunner(ctx, missing), store.ErrNotFound)
	wantErr(t, "RotateRunnerToken(missing)",
		s.RotateRunnerToken(ctx, r.ID+1, r.TokenDigest, digest(t), at(0), time.Time{}), store.ErrNotFound)
}

func testUpdateRunner(t *testing.T, s store.Store) {
	ctx := t.Context()
	r := createRunner(t, s)
	orig := *r

	upd := store.Runner{
		ID:              r.ID,
		Type:            store.GroupType,
		GroupID:         99,
		ProjectIDs:      nil,
		Description:     "renamed",
		MaintenanceNote: "",
		Tags:            []string{"arm64"},
		RunUntagged:     false,
		Locked:          false,
		Paused:          true,
		AccessLevel:     store.NotProtected,
		MaximumTimeout:  0,
		Legacy:          false,
		// Token fields and CreatedAt are not written by UpdateRunner.
		TokenDigest:     digest(t),
		TokenObtainedAt: at(time.Hour),
		TokenExpiresAt:  time.Time{},
		CreatedAt:       at(time.Hour),
		ContactedAt:     at(2 * time.Hour),
	}
	must(t, s.UpdateRunner(ctx, &upd))

	want := upd
	want.TokenDigest = orig.TokenDigest
	want.TokenObtainedAt = orig.TokenObtainedAt
	want.TokenExpiresAt = orig.TokenExpiresAt
	want.CreatedAt = orig.CreatedAt
	got, err := s.GetRunner(ctx, r.ID)
	must(t, err)
	check(t, "GetRunner after UpdateRunner", got, &want)
	if _, err := s.RunnerByTokenDigest(ctx, upd.TokenDigest); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("UpdateRunner changed the token digest (lookup by new digest: %v)", err)
	}
}

func testListRunners(t *testing.T, s store.Store) {
	ctx := t.Context()
	list, err := s.ListRunners(ctx)
	must(t, err)
	if len(list) != 0 {
		t.Fatalf("ListRunners on empty store: %d runners", len(list))
	}
	var want []*store.Runner
	for range 5 {
		want = append(want, createRunner(t, s))
	}
	must(t, s.DeleteRunner(ctx, want[2].ID))
	want = append(want[:2], want[3:]...)
	list, err = s.ListRunners(ctx)
	must(t, err)
	if len(list) != len(want) {
		t.Fatalf("ListRunners: %d runners, want %d", len(list), len(want))
	}
	for i := range want {
		check(t, "ListRunners (ordered by ID)", list[i], want[i])
	}
}

func testRotateRunnerToken(t *testing.T, s store.Store) {
	ctx := t.Context()
	r := createRunner(t, s)
	other := createRunner(t, s)
	oldDigest := r.TokenDigest
	newDigest := digest(t)

	must(t, s.RotateRunnerToken(ctx, r.ID, oldDigest, newDigest, at(time.Hour), at(48*time.Hour)))
	want := *r
	want.TokenDigest, want.TokenObtainedAt, want.TokenExpiresAt = newDigest, at(time.Hour), at(48*time.Hour)
	got, err := s.RunnerByTokenDigest(ctx, newDigest)
	must(t, err)
	check(t, "runner after rotate", got, &want)
	_, err = s.RunnerByTokenDigest(ctx, oldDigest)
	wantErr(t, "lookup by old digest after rotate", err, store.ErrNotFound)

	// A second reset that still believes in the old digest loses.
	err = s.RotateRunnerToken(ctx, r.ID, oldDigest, digest(t), at(2*time.Hour), time.Time{})
	wantErr(t, "RotateRunnerToken(stale old digest)", err, store.ErrConflict)
	got, err = s.GetRunner(ctx, r.ID)
	must(t, err)
	check(t, "runner after lost rotate", got, &want)

	// Rotating onto another runner's digest violates uniqueness.
	err = s.RotateRunnerToken(ctx, r.ID, newDigest, other.TokenDigest, at(2*time.Hour), time.Time{})
	wantErr(t, "RotateRunnerToken(digest of other runner)", err, store.ErrExists)

	// Zero expiry round-trips as "never".
	must(t, s.RotateRunnerToken(ctx, r.ID, newDigest, oldDigest, at(3*time.Hour), time.Time{}))
	want.TokenDigest, want.TokenObtainedAt, want.TokenExpiresAt = oldDigest, at(3*time.Hour), time.Time{}
	got, err = s.GetRunner(ctx, r.ID)
	must(t, err)
	check(t, "runner after second rotate", got, &want)
}

func testDeleteRunner(t *testing.T, s store.Store) {
	ctx := t.Context()
	r := createRunner(t, s)
	keep := createRunner(t, s)
	for _, sys := range []string{"s_a", "s_b"} {
		must(t, s.UpsertRunnerManager(ctx, &store.RunnerManager{RunnerID: r.ID, SystemID: sys, ContactedAt: at(0)}))
	}
	kept := &store.RunnerManager{RunnerID: keep.ID, SystemID: "s_a", Info: []byte(`{}`), ContactedAt: at(0)}
	must(t, s.UpsertRunnerManager(ctx, kept))

	must(t, s.DeleteRunner(ctx, r.ID))
	_, err := s.GetRunner(ctx, r.ID)
	wantErr(t, "GetRunner after delete", err, store.ErrNotFound)
	_, err = s.RunnerByTokenDigest(ctx, r.TokenDigest)
	wantErr(t, "RunnerByTokenDigest after delete", err, store.ErrNotFound)
	ms, err := s.ListRunnerManagers(ctx, r.ID)
	must(t, err)
	if len(ms) != 0 {
		t.Errorf("managers of deleted runner: %d, want 0 (cascade)", len(ms))
	}
	wantErr(t, "DeleteRunner twice", s.DeleteRunner(ctx, r.ID), store.ErrNotFound)

	ms, err = s.ListRunnerManagers(ctx, keep.ID)
	must(t, err)
	if len(ms) != 1 {
		t.Fatalf("managers of other runner: %d, want 1", len(ms))
	}
	check(t, "manager of other runner", ms[0], kept)

	// The digest of a deleted runner can be registered again.
	again := newRunner(t)
	again.TokenDigest = r.TokenDigest
	must(t, s.CreateRunner(ctx, again))
	if again.ID == r.ID {
		t.Errorf("new runner reuses the ID %d of a deleted runner", r.ID)
	}
}

func testRunnerManagers(t *testing.T, s store.Store) {
	ctx := t.Context()
	r := createRunner(t, s)
	other := createRunner(t, s)

	m1 := &store.RunnerManager{RunnerID: r.ID, SystemID: "s_0123456789ab", Info: []byte(`{"name":"gitlab-runner","version":"17.0"}`), CreatedAt: at(0), ContactedAt: at(time.Second)}
	must(t, s.UpsertRunnerManager(ctx, m1))
	if m1.ID == 0 {
		t.Fatal("UpsertRunnerManager did not set ID")
	}
	// Same system id under another runner is another manager.
	m3 := &store.RunnerManager{RunnerID: other.ID, SystemID: m1.SystemID, ContactedAt: at(0)}
	must(t, s.UpsertRunnerManager(ctx, m3))
	if m3.ID == m1.ID {
		t.Errorf("same system id under two runners shares manager ID %d", m1.ID)
	}
	if !sameTime(m3.CreatedAt, at(0)) {
		t.Errorf("insert with zero CreatedAt: CreatedAt = %v, want ContactedAt %v", m3.CreatedAt, at(0))
	}

	// Upsert of the same (runner, system id) keeps ID and CreatedAt and
	// updates info and contact time.
	m1b := &store.RunnerManager{RunnerID: r.ID, SystemID: m1.SystemID, Info: []byte(`{"version":"17.1"}`), CreatedAt: at(time.Hour), ContactedAt: at(time.Hour)}
	must(t, s.UpsertRunnerManager(ctx, m1b))
	if m1b.ID != m1.ID {
		t.Errorf("upsert of existing manager: ID %d, want %d", m1b.ID, m1.ID)
	}
	if !sameTime(m1b.CreatedAt, m1.CreatedAt) {
		t.Errorf("upsert of existing manager: CreatedAt set to %v, want original %v", m1b.CreatedAt, m1.CreatedAt)
	}
	m2 := &store.RunnerManager{RunnerID: r.ID, SystemID: "r_other", Info: nil, CreatedAt: at(2 * time.Hour), ContactedAt: at(2 * time.Hour)}
	must(t, s.UpsertRunnerManager(ctx, m2))

	ms, err := s.ListRunnerManagers(ctx, r.ID)
	must(t, err)
	want := []*store.RunnerManager{
		{ID: m1.ID, RunnerID: r.ID, SystemID: m1.SystemID, Info: m1b.Info, CreatedAt: m1.CreatedAt, ContactedAt: m1b.ContactedAt},
		m2,
	}
	if len(ms) != len(want) {
		t.Fatalf("ListRunnerManagers: %d managers, want %d", len(ms), len(want))
	}
	for i := range want {
		check(t, "ListRunnerManagers (ordered by ID)", ms[i], want[i])
	}

	ms, err = s.ListRunnerManagers(ctx, r.ID+other.ID+1)
	must(t, err)
	if len(ms) != 0 {
		t.Errorf("ListRunnerManagers(missing runner): %d managers", len(ms))
	}

	err = s.UpsertRunnerManager(ctx, &store.RunnerManager{RunnerID: r.ID + other.ID + 1, SystemID: "x", ContactedAt: at(0)})
	wantErr(t, "UpsertRunnerManager(missing runner)", err, store.ErrNotFound)
}

func testDeleteRunnerManager(t *testing.T, s store.Store) {
	ctx := t.Context()
	r := createRunner(t, s)
	a := &store.RunnerManager{RunnerID: r.ID, SystemID: "a", ContactedAt: at(0)}
	b := &store.RunnerManager{RunnerID: r.ID, SystemID: "b", ContactedAt: at(0)}
	must(t, s.UpsertRunnerManager(ctx, a))
	must(t, s.UpsertRunnerManager(ctx, b))

	wantErr(t, "DeleteRunnerManager(missing system id)", s.DeleteRunnerManager(ctx, r.ID, "c"), store.ErrNotFound)
	wantErr(t, "DeleteRunnerManager(missing runner)", s.DeleteRunnerManager(ctx, r.ID+1, "a"), store.ErrNotFound)
	must(t, s.DeleteRunnerManager(ctx, r.ID, "a"))
	wantErr(t, "DeleteRunnerManager twice", s.DeleteRunnerManager(ctx, r.ID, "a"), store.ErrNotFound)
	ms, err := s.ListRunnerManagers(ctx, r.ID)
	must(t, err)
	if len(ms) != 1 || ms[0].SystemID != "b" {
		t.Errorf("managers after delete: %v, want only b", ms)
	}

	// Upserting a deleted manager again creates a new one.
	a2 := &store.RunnerManager{RunnerID: r.ID, SystemID: "a", ContactedAt: at(time.Hour)}
	must(t, s.UpsertRunnerManager(ctx, a2))
	if a2.ID == a.ID {
		t.Errorf("re-created manager reuses deleted ID %d", a.ID)
	}
}
