package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/berthci/berth/coordinator/store"
)

// Users and sessions of the web UI.
const (
	userCols          = `id, name, role, token_digest, created_at`
	sqlCreateUser     = `INSERT INTO users (name, role, token_digest, created_at) VALUES (?, ?, ?, ?) RETURNING id`
	sqlGetUser        = `SELECT ` + userCols + ` FROM users WHERE id = ?`
	sqlUserByDigest   = `SELECT ` + userCols + ` FROM users WHERE token_digest = ?`
	sqlListUsers      = `SELECT ` + userCols + ` FROM users ORDER BY id`
	sqlDeleteUser     = `DELETE FROM users WHERE id = ?`
	sqlDeleteUserSess = `DELETE FROM sessions WHERE user_id = ?`

	sessionCols          = `digest, user_id, credential_digest, created_at, expires_at`
	sqlCreateSession     = `INSERT INTO sessions (` + sessionCols + `) VALUES (?, ?, ?, ?, ?)`
	sqlUserExists        = `SELECT COUNT(*) FROM users WHERE id = ?`
	sqlGetSession        = `SELECT ` + sessionCols + ` FROM sessions WHERE digest = ?`
	sqlDeleteSession     = `DELETE FROM sessions WHERE digest = ?`
	sqlDeleteExpiredSess = `DELETE FROM sessions WHERE expires_at < ?`
)

func scanUser(sc scanner) (*store.User, error) {
	var (
		u       store.User
		role    string
		created sql.NullInt64
	)
	if err := sc.Scan(&u.ID, &u.Name, &role, &u.TokenDigest, &created); err != nil {
		return nil, err
	}
	u.Role, u.CreatedAt = store.Role(role), timeCol(created)
	return &u, nil
}

// CreateUser inserts u and sets u.ID; store.ErrExists if the name or the
// token digest is taken.
func (s *Store) CreateUser(ctx context.Context, u *store.User) error {
	if u == nil || u.Name == "" || u.TokenDigest == "" || !u.Role.Valid() {
		return fmt.Errorf("creating user: %w", errInvalid)
	}
	var id int64
	err := s.write(ctx, func(tx *wtx) error {
		err := tx.queryRow(sqlCreateUser, u.Name, string(u.Role), u.TokenDigest, timeArg(u.CreatedAt)).Scan(&id)
		if s.isUnique(err) {
			return store.ErrExists
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("creating user %q: %w", u.Name, err)
	}
	u.ID = id
	return nil
}

// GetUser returns the user id.
func (s *Store) GetUser(ctx context.Context, id int64) (*store.User, error) {
	u, err := scanUser(s.queryRow(ctx, sqlGetUser, id))
	if err != nil {
		return nil, fmt.Errorf("getting user %d: %w", id, notFound(err))
	}
	return u, nil
}

// UserByTokenDigest returns the user with this token digest.
func (s *Store) UserByTokenDigest(ctx context.Context, digest string) (*store.User, error) {
	if digest == "" {
		return nil, fmt.Errorf("getting user by token: %w", store.ErrNotFound)
	}
	u, err := scanUser(s.queryRow(ctx, sqlUserByDigest, digest))
	if err != nil {
		return nil, fmt.Errorf("getting user by token: %w", notFound(err))
	}
	return u, nil
}

// ListUsers returns every user ordered by ID.
func (s *Store) ListUsers(ctx context.Context) ([]*store.User, error) {
	rows, err := s.query(ctx, sqlListUsers)
	if err != nil {
		return nil, fmt.Errorf("listing users: %w", err)
	}
	defer rows.Close()
	var out []*store.User
	for rows.Next() {
		u, err := scanUser(rows)
		if err != nil {
			return nil, fmt.Errorf("listing users: %w", err)
		}
		out = append(out, u)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing users: %w", err)
	}
	return out, nil
}

// DeleteUser removes a user, its sessions and its memberships in one
// transaction.
func (s *Store) DeleteUser(ctx context.Context, id int64) error {
	err := s.write(ctx, func(tx *wtx) error {
		n, err := tx.exec(sqlDeleteUser, id)
		if err != nil {
			return err
		}
		if n == 0 {
			return store.ErrNotFound
		}
		// Sessions have no foreign key (the admin token's have user 0);
		// memberships go by theirs.
		_, err = tx.exec(sqlDeleteUserSess, id)
		return err
	})
	if err != nil {
		return fmt.Errorf("deleting user %d: %w", id, err)
	}
	return nil
}

// CreateSession inserts a session.
func (s *Store) CreateSession(ctx context.Context, se *store.Session) error {
	if se == nil || se.Digest == "" || se.ExpiresAt.IsZero() {
		return fmt.Errorf("creating session: %w", errInvalid)
	}
	err := s.write(ctx, func(tx *wtx) error {
		if se.UserID != 0 {
			var n int
			if err := tx.queryRow(sqlUserExists, se.UserID).Scan(&n); err != nil {
				return err
			}
			if n == 0 {
				return store.ErrNotFound
			}
		}
		_, err := tx.exec(sqlCreateSession, se.Digest, se.UserID, se.CredentialDigest, timeArg(se.CreatedAt), timeArg(se.ExpiresAt))
		if s.isUnique(err) {
			return store.ErrExists
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("creating session: %w", err)
	}
	return nil
}

// GetSession returns the session of a digest.
func (s *Store) GetSession(ctx context.Context, digest string) (*store.Session, error) {
	var (
		se               store.Session
		created, expires sql.NullInt64
	)
	if digest == "" {
		return nil, fmt.Errorf("getting session: %w", store.ErrNotFound)
	}
	err := s.queryRow(ctx, sqlGetSession, digest).Scan(&se.Digest, &se.UserID, &se.CredentialDigest, &created, &expires)
	if err != nil {
		return nil, fmt.Errorf("getting session: %w", notFound(err))
	}
	se.CreatedAt, se.ExpiresAt = timeCol(created), timeCol(expires)
	return &se, nil
}

// DeleteSession removes a session.
func (s *Store) DeleteSession(ctx context.Context, digest string) error {
	err := s.writeRow(ctx, func(tx *wtx) error {
		n, err := tx.exec(sqlDeleteSession, digest)
		if err == nil && n == 0 {
			return store.ErrNotFound
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("deleting session: %w", err)
	}
	return nil
}

// DeleteExpiredSessions removes sessions that expired before t.
func (s *Store) DeleteExpiredSessions(ctx context.Context, before time.Time) (int, error) {
	var n int64
	err := s.writeRow(ctx, func(tx *wtx) error {
		var err error
		n, err = tx.exec(sqlDeleteExpiredSess, before.UnixMicro())
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("deleting expired sessions: %w", err)
	}
	return int(n), nil
}

// Project members.
const (
	memberCols   = `project_id, user_id, access_level, created_at`
	sqlPutMember = `INSERT INTO project_members (` + memberCols + `) VALUES (?, ?, ?, ?) ON CONFLICT (project_id, user_id) DO UPDATE SET access_level = excluded.access_level`
	// A membership is read with its user's name (one query, not one per member).
	memberRead     = `SELECT m.project_id, m.user_id, m.access_level, m.created_at, u.name FROM project_members m JOIN users u ON u.id = m.user_id`
	sqlGetMember   = memberRead + ` WHERE m.project_id = ? AND m.user_id = ?`
	sqlListMembers = memberRead + ` WHERE m.project_id = ? ORDER BY m.user_id`
	sqlUserMembers = memberRead + ` WHERE m.user_id = ? ORDER BY m.project_id`
	sqlDelMember   = `DELETE FROM project_members WHERE project_id = ? AND user_id = ?`
	sqlMemberLevel = `SELECT access_level FROM project_members WHERE project_id = ? AND user_id = ?`
	sqlOwnerCount  = `SELECT COUNT(*) FROM project_members WHERE project_id = ? AND access_level >= ?`
	sqlSetMember   = `UPDATE project_members SET access_level = ? WHERE project_id = ? AND user_id = ?`
)

func scanMember(sc scanner) (*store.ProjectMember, error) {
	var (
		m       store.ProjectMember
		level   int64
		created sql.NullInt64
	)
	if err := sc.Scan(&m.ProjectID, &m.UserID, &level, &created, &m.UserName); err != nil {
		return nil, err
	}
	m.AccessLevel, m.CreatedAt = store.MemberAccess(level), timeCol(created)
	return &m, nil
}

// GetProjectMember returns a user's membership of a project.
func (s *Store) GetProjectMember(ctx context.Context, projectID, userID int64) (*store.ProjectMember, error) {
	m, err := scanMember(s.queryRow(ctx, sqlGetMember, projectID, userID))
	if err != nil {
		return nil, fmt.Errorf("getting user %d's membership of project %d: %w", userID, projectID, notFound(err))
	}
	return m, nil
}

// ListProjectMembers returns a project's members ordered by user ID.
func (s *Store) ListProjectMembers(ctx context.Context, projectID int64) ([]*store.ProjectMember, error) {
	return s.listMembers(ctx, fmt.Sprintf("listing the members of project %d", projectID), sqlListMembers, projectID)
}

// MembershipsOfUser returns a user's memberships ordered by project ID.
func (s *Store) MembershipsOfUser(ctx context.Context, userID int64) ([]*store.ProjectMember, error) {
	return s.listMembers(ctx, fmt.Sprintf("listing the memberships of user %d", userID), sqlUserMembers, userID)
}

func (s *Store) listMembers(ctx context.Context, what, query string, id int64) ([]*store.ProjectMember, error) {
	rows, err := s.query(ctx, query, id)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	defer rows.Close()
	var out []*store.ProjectMember
	for rows.Next() {
		m, err := scanMember(rows)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return out, nil
}

// ChangeProjectMember adds, changes or removes a membership if it is still
// at c.From, keeping the project's last owner when c.KeepOwner. The read,
// the check and the write are one serializable transaction: two owners
// demoting each other at once leave one of them owner (PostgreSQL aborts
// and retries the second; SQLite has one writer).
func (s *Store) ChangeProjectMember(ctx context.Context, c store.MemberChange) error {
	if (c.To != 0 && !c.To.Valid()) || (c.From != 0 && !c.From.Valid()) {
		return fmt.Errorf("changing project member: %w", errInvalid)
	}
	err := s.write(ctx, func(tx *wtx) error {
		var cur int64
		switch err := tx.queryRow(sqlMemberLevel, c.ProjectID, c.UserID).Scan(&cur); {
		case errors.Is(err, sql.ErrNoRows):
			cur = 0
		case err != nil:
			return err
		}
		switch {
		case store.MemberAccess(cur) == c.From:
		case cur == 0:
			return store.ErrNotFound
		default:
			return store.ErrConflict
		}
		if c.KeepOwner && store.MemberAccess(cur) >= store.AccessOwner && c.To < store.AccessOwner {
			var owners int64
			if err := tx.queryRow(sqlOwnerCount, c.ProjectID, int64(store.AccessOwner)).Scan(&owners); err != nil {
				return err
			}
			if owners <= 1 {
				return store.ErrLastOwner
			}
		}
		var err error
		switch {
		case c.To == 0 && cur == 0:
			return store.ErrNotFound // nobody to remove
		case c.To == 0:
			_, err = tx.exec(sqlDelMember, c.ProjectID, c.UserID)
		case cur == 0:
			_, err = tx.exec(sqlPutMember, c.ProjectID, c.UserID, int64(c.To), timeArg(c.CreatedAt))
		default:
			_, err = tx.exec(sqlSetMember, int64(c.To), c.ProjectID, c.UserID)
		}
		if s.isForeignKey(err) {
			return store.ErrNotFound
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("changing user %d's membership of project %d from %d to %d: %w", c.UserID, c.ProjectID, c.From, c.To, err)
	}
	return nil
}
