package dispatch

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/berthci/berth/coordinator/jobtoken"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/token"
)

// Errors of Authenticate.
var (
	// ErrBadToken: not a token of a job of this cell, not the job's
	// current hand-out, or expired (wrapping jobtoken.ErrExpired).
	ErrBadToken = errors.New("invalid job token")
	// ErrJobNotRunning: the token's job is no longer handed out (it
	// finished): its tokens are revoked. Authenticate returns the job
	// with it, so that callers can tell its status.
	ErrJobNotRunning = errors.New("job is not running")
)

// Authenticate returns the job a job token belongs to and what the token
// may do. The token must be the job's current hand-out's and the job
// handed out and not finished. The job is this replica's copy when it
// handed the job out, so a running job's many updates read no store.
func (d *Dispatcher) Authenticate(ctx context.Context, tok string) (*store.Job, *jobtoken.Claims, error) {
	if !jobtoken.IsJWT(tok) {
		return d.authenticateLegacy(ctx, tok)
	}
	c, err := d.tokens.Verify(ctx, tok)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrBadToken, err)
	}
	j, err := d.Job(ctx, c.JobID)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil, ErrBadToken
	}
	if err != nil {
		return nil, nil, err
	}
	if j.TokenDigest == "" || !token.Equal(j.TokenDigest, jobtoken.HandOutDigest(c.HandOut)) {
		return nil, nil, ErrBadToken
	}
	if !TokenActive(j) {
		return j, c, ErrJobNotRunning
	}
	return j, c, nil
}

// authenticateLegacy accepts a job token minted before job tokens were
// JWTs (a job handed out by an older coordinator, still running across
// an upgrade): a random glcbt- token whose digest the store keeps. It may
// do all a runner's token may.
func (d *Dispatcher) authenticateLegacy(ctx context.Context, tok string) (*store.Job, *jobtoken.Claims, error) {
	if !strings.HasPrefix(tok, token.PrefixJob) {
		return nil, nil, ErrBadToken
	}
	j, err := d.store.JobByTokenDigest(ctx, token.Digest(tok))
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil, ErrBadToken
	}
	if err != nil {
		return nil, nil, err
	}
	c := &jobtoken.Claims{JobID: j.ID, ProjectID: j.ProjectID, Scopes: jobtoken.RunnerScopes, Dependencies: j.Dependencies}
	if !TokenActive(j) {
		return j, c, ErrJobNotRunning
	}
	return j, c, nil
}
