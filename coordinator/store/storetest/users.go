package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/store"
)

func testUsers(t *testing.T, s store.Store) {
	ctx := t.Context()
	_, err := s.GetUser(ctx, 1)
	wantErr(t, "GetUser(missing)", err, store.ErrNotFound)
	_, err = s.UserByTokenDigest(ctx, "")
	wantErr(t, "UserByTokenDigest(\"\")", err, store.ErrNotFound)

	alice := &store.User{Name: "alice", Role: store.RoleAdmin, TokenDigest: digest(t), CreatedAt: at(0)}
	bob := &store.User{Name: "bob", Role: store.RoleReadOnly, TokenDigest: digest(t), CreatedAt: at(time.Second)}
	must(t, s.CreateUser(ctx, alice))
	must(t, s.CreateUser(ctx, bob))
	if alice.ID == 0 || bob.ID == alice.ID {
		t.Fatalf("CreateUser ids: %d, %d", alice.ID, bob.ID)
	}
	wantErr(t, "CreateUser(taken name)", s.CreateUser(ctx, &store.User{Name: "alice", Role: store.RoleAdmin, TokenDigest: digest(t)}), store.ErrExists)
	wantErr(t, "CreateUser(taken digest)", s.CreateUser(ctx, &store.User{Name: "carol", Role: store.RoleAdmin, TokenDigest: bob.TokenDigest}), store.ErrExists)
	if err := s.CreateUser(ctx, &store.User{Name: "dave", Role: "root", TokenDigest: digest(t)}); err == nil {
		t.Error("CreateUser with an unknown role: no error")
	}

	got, err := s.GetUser(ctx, bob.ID)
	must(t, err)
	check(t, "GetUser", got, bob)
	got, err = s.UserByTokenDigest(ctx, alice.TokenDigest)
	must(t, err)
	check(t, "UserByTokenDigest", got, alice)
	list, err := s.ListUsers(ctx)
	must(t, err)
	if len(list) != 2 {
		t.Fatalf("ListUsers: %d users, want 2", len(list))
	}
	check(t, "ListUsers[0]", list[0], alice)
	check(t, "ListUsers[1]", list[1], bob)

	must(t, s.DeleteUser(ctx, alice.ID))
	wantErr(t, "DeleteUser(again)", s.DeleteUser(ctx, alice.ID), store.ErrNotFound)
	_, err = s.UserByTokenDigest(ctx, alice.TokenDigest)
	wantErr(t, "UserByTokenDigest(deleted)", err, store.ErrNotFound)
}

func testSessions(t *testing.T, s store.Store) {
	ctx := t.Context()
	u := &store.User{Name: "erin", Role: store.RoleReadOnly, TokenDigest: digest(t), CreatedAt: at(0)}
	must(t, s.CreateUser(ctx, u))

	admin := &store.Session{Digest: digest(t), CredentialDigest: digest(t), CreatedAt: at(0), ExpiresAt: at(time.Hour)}
	user := &store.Session{Digest: digest(t), UserID: u.ID, CredentialDigest: u.TokenDigest, CreatedAt: at(0), ExpiresAt: at(2 * time.Hour)}
	must(t, s.CreateSession(ctx, admin))
	must(t, s.CreateSession(ctx, user))
	wantErr(t, "CreateSession(same digest)", s.CreateSession(ctx, &store.Session{Digest: admin.Digest, ExpiresAt: at(time.Hour)}), store.ErrExists)
	wantErr(t, "CreateSession(missing user)", s.CreateSession(ctx, &store.Session{Digest: digest(t), UserID: u.ID + 100, ExpiresAt: at(time.Hour)}), store.ErrNotFound)

	got, err := s.GetSession(ctx, admin.Digest)
	must(t, err)
	check(t, "GetSession(admin)", got, admin)
	got, err = s.GetSession(ctx, user.Digest)
	must(t, err)
	check(t, "GetSession(user)", got, user)
	_, err = s.GetSession(ctx, "")
	wantErr(t, "GetSession(\"\")", err, store.ErrNotFound)

	// Expired strictly before the time given.
	n, err := s.DeleteExpiredSessions(ctx, at(time.Hour))
	must(t, err)
	if n != 0 {
		t.Errorf("DeleteExpiredSessions(at expiry) = %d, want 0", n)
	}
	n, err = s.DeleteExpiredSessions(ctx, at(time.Hour+time.Microsecond))
	must(t, err)
	if n != 1 {
		t.Errorf("DeleteExpiredSessions = %d, want 1", n)
	}
	_, err = s.GetSession(ctx, admin.Digest)
	wantErr(t, "GetSession(expired, deleted)", err, store.ErrNotFound)

	// Deleting a user ends its sessions.
	must(t, s.DeleteUser(ctx, u.ID))
	_, err = s.GetSession(ctx, user.Digest)
	wantErr(t, "GetSession(of a deleted user)", err, store.ErrNotFound)

	third := &store.Session{Digest: digest(t), CredentialDigest: digest(t), CreatedAt: at(0), ExpiresAt: at(time.Hour)}
	must(t, s.CreateSession(ctx, third))
	must(t, s.DeleteSession(ctx, third.Digest))
	wantErr(t, "DeleteSession(again)", s.DeleteSession(ctx, third.Digest), store.ErrNotFound)
}

func testRunnerManagerFleet(t *testing.T, s store.Store) {
	ctx := t.Context()
	r := createRunner(t, s)
	other := createRunner(t, s)
	m := &store.RunnerManager{RunnerID: r.ID, SystemID: "s_fleet", Info: []byte(`{"name":"berth"}`), ContactedAt: at(0)}
	must(t, s.UpsertRunnerManager(ctx, m))
	o := &store.RunnerManager{RunnerID: other.ID, SystemID: "s_other", ContactedAt: at(0)}
	must(t, s.UpsertRunnerManager(ctx, o))

	wantErr(t, "PutRunnerManagerFleet(missing manager)", s.PutRunnerManagerFleet(ctx, r.ID, "nope", []byte(`{}`), at(0)), store.ErrNotFound)
	fleet := []byte(`{"instances":3}`)
	must(t, s.PutRunnerManagerFleet(ctx, r.ID, m.SystemID, fleet, at(time.Minute)))
	// A later contact (info upsert) keeps the fleet report.
	m.ContactedAt = at(2 * time.Minute)
	must(t, s.UpsertRunnerManager(ctx, m))

	all, err := s.ListRunnerManagers(ctx, 0)
	must(t, err)
	if len(all) != 2 {
		t.Fatalf("ListRunnerManagers(0): %d managers, want 2 (every runner's)", len(all))
	}
	want := &store.RunnerManager{ID: m.ID, RunnerID: r.ID, SystemID: m.SystemID, Info: m.Info, CreatedAt: at(0),
		ContactedAt: at(2 * time.Minute), Fleet: fleet, FleetReportedAt: at(time.Minute)}
	check(t, "manager with a fleet report", all[0], want)
	check(t, "manager without one", all[1], &store.RunnerManager{ID: o.ID, RunnerID: other.ID, SystemID: o.SystemID, CreatedAt: at(0), ContactedAt: at(0)})
}

func testProjectMembers(t *testing.T, s store.Store) {
	ctx := t.Context()
	web := &store.Project{Path: "acme/web", Name: "web", Visibility: "private", CreatedAt: at(0)}
	api := &store.Project{Path: "acme/api", Name: "api", Visibility: "private", CreatedAt: at(0)}
	must(t, s.CreateProject(ctx, web))
	must(t, s.CreateProject(ctx, api))
	ann := &store.User{Name: "ann", Role: store.RoleReadOnly, TokenDigest: digest(t), CreatedAt: at(0)}
	ben := &store.User{Name: "ben", Role: store.RoleReadOnly, TokenDigest: digest(t), CreatedAt: at(0)}
	must(t, s.CreateUser(ctx, ann))
	must(t, s.CreateUser(ctx, ben))

	_, err := s.GetProjectMember(ctx, web.ID, ann.ID)
	wantErr(t, "GetProjectMember(not a member)", err, store.ErrNotFound)
	wantErr(t, "ChangeProjectMember(missing project)", s.ChangeProjectMember(ctx, store.MemberChange{ProjectID: web.ID + api.ID + 100, UserID: ann.ID, To: store.AccessDeveloper}), store.ErrNotFound)
	wantErr(t, "ChangeProjectMember(missing user)", s.ChangeProjectMember(ctx, store.MemberChange{ProjectID: web.ID, UserID: ann.ID + ben.ID + 100, To: store.AccessDeveloper}), store.ErrNotFound)
	if err := s.ChangeProjectMember(ctx, store.MemberChange{ProjectID: web.ID, UserID: ann.ID, To: 35}); err == nil {
		t.Error("ChangeProjectMember to access level 35: no error")
	}

	annWeb := &store.ProjectMember{ProjectID: web.ID, UserID: ann.ID, AccessLevel: store.AccessDeveloper, CreatedAt: at(time.Second)}
	annAPI := &store.ProjectMember{ProjectID: api.ID, UserID: ann.ID, AccessLevel: store.AccessMaintainer, CreatedAt: at(2 * time.Second)}
	benWeb := &store.ProjectMember{ProjectID: web.ID, UserID: ben.ID, AccessLevel: store.AccessOwner, CreatedAt: at(3 * time.Second)}
	for _, m := range []*store.ProjectMember{annWeb, annAPI, benWeb} {
		must(t, s.ChangeProjectMember(ctx, store.MemberChange{ProjectID: m.ProjectID, UserID: m.UserID, To: m.AccessLevel, CreatedAt: m.CreatedAt}))
	}
	// Read back with the user's name.
	annWeb.UserName, annAPI.UserName, benWeb.UserName = ann.Name, ann.Name, ben.Name
	got, err := s.GetProjectMember(ctx, web.ID, ann.ID)
	must(t, err)
	check(t, "GetProjectMember", got, annWeb)

	// A change of level keeps when the member joined.
	must(t, s.ChangeProjectMember(ctx, store.MemberChange{ProjectID: web.ID, UserID: ann.ID, From: store.AccessDeveloper, To: store.AccessMaintainer, CreatedAt: at(time.Hour)}))
	annWeb.AccessLevel = store.AccessMaintainer
	got, err = s.GetProjectMember(ctx, web.ID, ann.ID)
	must(t, err)
	check(t, "GetProjectMember after a change", got, annWeb)

	list, err := s.ListProjectMembers(ctx, web.ID)
	must(t, err)
	if len(list) != 2 {
		t.Fatalf("ListProjectMembers(web): %d members, want 2", len(list))
	}
	check(t, "ListProjectMembers[0]", list[0], annWeb)
	check(t, "ListProjectMembers[1]", list[1], benWeb)
	list, err = s.MembershipsOfUser(ctx, ann.ID)
	must(t, err)
	if len(list) != 2 {
		t.Fatalf("MembershipsOfUser(ann): %d, want 2", len(list))
	}
	check(t, "MembershipsOfUser[0]", list[0], annWeb)
	check(t, "MembershipsOfUser[1]", list[1], annAPI)

	must(t, s.ChangeProjectMember(ctx, store.MemberChange{ProjectID: web.ID, UserID: ben.ID, From: store.AccessOwner}))
	wantErr(t, "removing a member again", s.ChangeProjectMember(ctx, store.MemberChange{ProjectID: web.ID, UserID: ben.ID, From: store.AccessOwner}), store.ErrNotFound)
	_, err = s.GetProjectMember(ctx, web.ID, ben.ID)
	wantErr(t, "GetProjectMember(removed)", err, store.ErrNotFound)

	// A deleted user's memberships go with it.
	must(t, s.DeleteUser(ctx, ann.ID))
	list, err = s.ListProjectMembers(ctx, api.ID)
	must(t, err)
	if len(list) != 0 {
		t.Errorf("the api project's members after its member's deletion: %+v", list)
	}
	list, err = s.MembershipsOfUser(ctx, ann.ID)
	must(t, err)
	if len(list) != 0 {
		t.Errorf("a deleted user's memberships: %+v", list)
	}
}

func testChangeProjectMember(t *testing.T, s store.Store) {
	ctx := t.Context()
	web := &store.Project{Path: "acme/web", Name: "web", Visibility: "private", CreatedAt: at(0)}
	must(t, s.CreateProject(ctx, web))
	var users []*store.User
	for _, n := range []string{"ann", "ben", "cat"} {
		u := &store.User{Name: n, Role: store.RoleReadOnly, TokenDigest: digest(t), CreatedAt: at(0)}
		must(t, s.CreateUser(ctx, u))
		users = append(users, u)
	}
	ann, ben, cat := users[0].ID, users[1].ID, users[2].ID
	change := func(user int64, from, to store.MemberAccess, keep bool) error {
		return s.ChangeProjectMember(ctx, store.MemberChange{ProjectID: web.ID, UserID: user, From: from, To: to, KeepOwner: keep, CreatedAt: at(time.Minute)})
	}
	level := func(user int64) store.MemberAccess {
		t.Helper()
		m, err := s.GetProjectMember(ctx, web.ID, user)
		if errors.Is(err, store.ErrNotFound) {
			return 0
		}
		must(t, err)
		return m.AccessLevel
	}

	must(t, change(ann, 0, store.AccessOwner, true))
	m, err := s.GetProjectMember(ctx, web.ID, ann)
	must(t, err)
	check(t, "added member", m, &store.ProjectMember{ProjectID: web.ID, UserID: ann, AccessLevel: store.AccessOwner, CreatedAt: at(time.Minute), UserName: "ann"})
	wantErr(t, "add an existing member", change(ann, 0, store.AccessDeveloper, true), store.ErrConflict)
	wantErr(t, "change a non-member", change(ben, store.AccessDeveloper, store.AccessMaintainer, true), store.ErrNotFound)
	wantErr(t, "remove a non-member", change(ben, 0, 0, true), store.ErrNotFound)
	wantErr(t, "add to a missing project", s.ChangeProjectMember(ctx, store.MemberChange{ProjectID: web.ID + 100, UserID: ben, To: store.AccessDeveloper}), store.ErrNotFound)
	wantErr(t, "add a missing user", change(cat+100, 0, store.AccessDeveloper, true), store.ErrNotFound)
	if err := change(ben, 0, 35, true); err == nil {
		t.Error("access level 35: no error")
	}

	// The last owner stays unless KeepOwner is off (an instance admin).
	wantErr(t, "demote the last owner", change(ann, store.AccessOwner, store.AccessMaintainer, true), store.ErrLastOwner)
	wantErr(t, "remove the last owner", change(ann, store.AccessOwner, 0, true), store.ErrLastOwner)
	if level(ann) != store.AccessOwner {
		t.Fatalf("ann's level after refused changes: %d", level(ann))
	}
	must(t, change(ben, 0, store.AccessDeveloper, true))
	// Decided for a level the member no longer has.
	wantErr(t, "stale from", change(ben, store.AccessMaintainer, 0, true), store.ErrConflict)
	must(t, change(ben, store.AccessDeveloper, store.AccessOwner, true))
	must(t, change(ann, store.AccessOwner, store.AccessDeveloper, true))
	must(t, change(ann, store.AccessDeveloper, 0, true))
	if level(ann) != 0 || level(ben) != store.AccessOwner {
		t.Errorf("levels ann %d ben %d, want 0 and owner", level(ann), level(ben))
	}
	must(t, change(ben, store.AccessOwner, 0, false))
	if level(ben) != 0 {
		t.Errorf("an admin's removal of the last owner did not apply")
	}

	// Two owners demoting each other at once: one change applies, the
	// other finds the project's last owner; an owner remains. Repeated, so
	// that the two transactions overlap on some rounds.
	for round := range 20 {
		a, b := users[round%3].ID, users[(round+1)%3].ID
		for _, u := range users {
			if l := level(u.ID); l != 0 {
				must(t, change(u.ID, l, 0, false))
			}
		}
		must(t, change(a, 0, store.AccessOwner, true))
		must(t, change(b, 0, store.AccessOwner, true))
		errs := make(chan error, 2)
		start := make(chan struct{})
		for _, u := range []int64{a, b} {
			go func() {
				<-start
				errs <- change(u, store.AccessOwner, store.AccessDeveloper, true)
			}()
		}
		close(start)
		var ok, last int
		for range 2 {
			switch err := <-errs; {
			case err == nil:
				ok++
			case errors.Is(err, store.ErrLastOwner):
				last++
			default:
				t.Fatalf("round %d: %v", round, err)
			}
		}
		if ok != 1 || last != 1 {
			t.Fatalf("round %d: %d changes applied, %d refused as the last owner; want 1 and 1", round, ok, last)
		}
		if level(a) != store.AccessOwner && level(b) != store.AccessOwner {
			t.Fatalf("round %d: no owner left", round)
		}
	}
}
