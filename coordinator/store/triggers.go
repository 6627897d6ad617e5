package store

import "time"

// PipelineTrigger is a project's pipeline trigger token (GitLab's
// pipeline triggers): whoever holds the token creates pipelines of the
// project through POST /projects/:id/trigger/pipeline, with its owner's
// access. Only the token's digest is kept.
type PipelineTrigger struct {
	ID          int64
	ProjectID   int64
	Description string
	// OwnerID is the user who created or took it: 0 for the admin token.
	OwnerID int64
	// TokenDigest is token.Digest of the token (unique); TokenHint its
	// first characters, shown to tell tokens apart.
	TokenDigest, TokenHint string
	CreatedAt, UpdatedAt   time.Time
	// LastUsed is when it last created a pipeline (zero: never);
	// ExpiresAt when it stops working (zero: never).
	LastUsed, ExpiresAt time.Time
}
