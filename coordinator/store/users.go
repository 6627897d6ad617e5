package store

import (
	"context"
	"errors"
	"time"
)

// Role is what a user may do in the web UI.
type Role string

// Roles. An admin may act (cancel, retry, play); a read-only user may
// only look.
const (
	RoleAdmin    Role = "admin"
	RoleReadOnly Role = "read-only"
)

// Valid reports whether r is a known role.
func (r Role) Valid() bool { return r == RoleAdmin || r == RoleReadOnly }

// User is a person who signs in to the web UI with a token of their own.
// Only the token's digest is kept.
type User struct {
	ID          int64
	Name        string // unique
	Role        Role
	TokenDigest string // unique
	CreatedAt   time.Time
}

// Session is a signed-in browser. Only the digest of its secret (the
// cookie's value) is kept, so a copy of the database opens no session.
type Session struct {
	Digest string
	// UserID is the user signed in; 0 for the admin token.
	UserID int64
	// CredentialDigest is the digest of the token signed in with: a
	// session ends when that token is no longer the user's (or the
	// admin token changed).
	CredentialDigest string
	CreatedAt        time.Time
	ExpiresAt        time.Time
}

// MemberAccess is a user's role in one project, with GitLab's numbers
// (the members API's access_level).
type MemberAccess int

// Access levels. Berth acts on two thresholds: a maintainer (or owner)
// is the project's admin — may fetch and list its VM snapshots, erase its
// jobs, delete its pipelines — and every level below may only look.
const (
	AccessGuest      MemberAccess = 10
	AccessReporter   MemberAccess = 20
	AccessDeveloper  MemberAccess = 30
	AccessMaintainer MemberAccess = 40
	AccessOwner      MemberAccess = 50
)

// Valid reports whether l is one of GitLab's member access levels.
func (l MemberAccess) Valid() bool {
	switch l {
	case AccessGuest, AccessReporter, AccessDeveloper, AccessMaintainer, AccessOwner:
		return true
	}
	return false
}

// ActAccess is the level a member needs to run, cancel or retry a
// pipeline or job: developer, maintainer on a protected ref (GitLab's
// defaults: protected branches are the maintainers').
func ActAccess(protected bool) MemberAccess {
	if protected {
		return AccessMaintainer
	}
	return AccessDeveloper
}

// ProjectAdmin reports whether l makes a member the project's admin.
func (l MemberAccess) ProjectAdmin() bool { return l >= AccessMaintainer }

// ProjectMember is a user's membership of a project.
type ProjectMember struct {
	ProjectID   int64
	UserID      int64
	AccessLevel MemberAccess
	CreatedAt   time.Time
	// UserName is the user's name, read with the membership.
	UserName string
}

// MemberChange is a conditional change of a user's membership of a
// project (Store.ChangeProjectMember), decided for the membership as it
// was read: it applies only if that is still so.
type MemberChange struct {
	ProjectID, UserID int64
	// From is the level the change was decided for, 0 for "not a member";
	// the change is refused with ErrConflict when the membership is no
	// longer at it (ErrNotFound when it is gone).
	From MemberAccess
	// To is the new level; 0 removes the membership.
	To MemberAccess
	// CreatedAt is an added member's time.
	CreatedAt time.Time
	// KeepOwner refuses, with ErrLastOwner, a change that would leave a
	// project that has an owner without one.
	KeepOwner bool
}

// AccessOf is user u's access level in project id: AccessOwner for an
// admin user (an instance admin acts in every project), the member's
// level for a member, 0 for anyone else and in project 0 (jobs enqueued
// without a project).
func AccessOf(ctx context.Context, st Store, u *User, projectID int64) (MemberAccess, error) {
	if u.Role == RoleAdmin {
		return AccessOwner, nil
	}
	if projectID == 0 {
		return 0, nil
	}
	m, err := st.GetProjectMember(ctx, projectID, u.ID)
	if errors.Is(err, ErrNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return m.AccessLevel, nil
}
