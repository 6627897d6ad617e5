package store

import "time"

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
