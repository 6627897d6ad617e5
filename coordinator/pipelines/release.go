package pipelines

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"

	"github.com/berthci/berth/ci"
	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/coordinator/gitrepo"
	"github.com/berthci/berth/coordinator/pages"
	"github.com/berthci/berth/coordinator/store"
)

// Releases: GitLab appends a release-cli step to a job with the release
// keyword; Berth creates the release itself when the job reports success,
// before it records the success, so a release that cannot be created
// fails the job as the release-cli step would (with the reason in the
// job's log). No release-cli image is needed.

// maxReleaseDescription bounds a description read from a file (GitLab's
// limit on a release description is 1,000,000 characters).
const maxReleaseDescription = 1_000_000

// ReleaseError is a release that cannot be created for a reason the job's
// author can fix; it fails the job.
type ReleaseError struct{ msg string }

func (e *ReleaseError) Error() string { return e.msg }

func releaseErrorf(format string, args ...any) error {
	return &ReleaseError{msg: fmt.Sprintf(format, args...)}
}

// CreateJobRelease creates the release of a job that succeeded. Errors
// the job's author can fix are *ReleaseError.
func (s *Engine) CreateJobRelease(ctx context.Context, j *store.Job, rel *ci.Release) (*store.Release, error) {
	full, err := s.store.GetJob(ctx, j.ID)
	if err != nil {
		return nil, err
	}
	var spec dispatch.JobSpec
	if err := json.Unmarshal(full.Spec, &spec); err != nil {
		return nil, fmt.Errorf("decoding spec of job %d: %w", j.ID, err)
	}
	vars, err := dispatch.JobVariables(ctx, s.store, s.baseURL(), full, &spec)
	if err != nil {
		return nil, err
	}
	x := func(v string) string { return strings.TrimSpace(dispatch.ExpandString(v, vars)) }
	tag := x(rel.TagName)
	if tag == "" {
		return nil, releaseErrorf("release:tag_name %q is empty after variables are expanded", rel.TagName)
	}
	if !validRefName(tag) {
		return nil, releaseErrorf("release:tag_name %q is not a valid tag name", tag)
	}
	if _, err := s.store.GetRelease(ctx, j.ProjectID, tag); err == nil {
		return nil, releaseErrorf("release %s already exists", tag)
	} else if !errors.Is(err, store.ErrNotFound) {
		return nil, err
	}
	r := &store.Release{ProjectID: j.ProjectID, TagName: tag, Name: x(rel.Name), JobID: j.ID}
	if r.Name == "" {
		r.Name = tag // GitLab: the tag name when no name is given
	}
	for _, m := range rel.Milestones {
		if m = x(m); m != "" {
			r.Milestones = append(r.Milestones, m)
		}
	}
	for i, l := range rel.Links {
		link := store.ReleaseLink{ID: int64(i + 1), Name: x(l.Name), URL: x(l.URL), LinkType: l.LinkType, DirectAssetPath: x(l.DirectAssetPath)}
		if link.LinkType == "" {
			link.LinkType = "other"
		}
		if link.DirectAssetPath != "" && !strings.HasPrefix(link.DirectAssetPath, "/") {
			link.DirectAssetPath = "/" + link.DirectAssetPath
		}
		if !validReleaseURL(link.URL) {
			return nil, releaseErrorf("release:assets:links %q: url %q is not a valid URL", link.Name, link.URL)
		}
		r.Links = append(r.Links, link)
	}
	now := s.clock.Now().UTC()
	r.CreatedAt, r.ReleasedAt = now, now
	if v := x(rel.ReleasedAt); v != "" {
		t, ok := ci.ParseISO8601(v)
		if !ok {
			return nil, releaseErrorf("release:released_at %q is not an ISO 8601 time", v)
		}
		r.ReleasedAt = t
	}
	if r.Description, err = s.releaseDescription(ctx, j.ID, x(rel.Description)); err != nil {
		return nil, err
	}

	proj, err := s.store.GetProject(ctx, j.ProjectID)
	if err != nil {
		return nil, err
	}
	repo, err := s.git.Repo(ctx, proj)
	if err != nil {
		return nil, err
	}
	lock := s.git.RepoLock(proj.ID)
	lock.Lock()
	defer lock.Unlock()
	refs, err := repo.Refs(ctx)
	if err != nil {
		return nil, err
	}
	if sha, ok := refs["refs/tags/"+tag]; ok {
		r.Sha = sha
	} else {
		target := spec.Sha
		if ref := x(rel.Ref); ref != "" {
			if target, err = repo.ResolveCommit(ctx, ref); err != nil {
				return nil, releaseErrorf("release:ref %q is not a branch, tag or commit of the project", ref)
			}
		}
		if err := repo.CreateTag(ctx, tag, target, x(rel.TagMessage), gitrepo.Author{}); err != nil {
			return nil, fmt.Errorf("creating tag %s: %w", tag, err)
		}
		r.Sha = target
		s.log.Info("tag created for a release", "project_id", proj.ID, "tag", tag, "sha", dispatch.ShortSha(target))
	}
	if err := s.store.CreateRelease(ctx, r); errors.Is(err, store.ErrExists) {
		return nil, releaseErrorf("release %s already exists", tag)
	} else if err != nil {
		return nil, err
	}
	s.log.Info("release created", "project_id", proj.ID, "tag", tag, "job_id", j.ID)
	return r, nil
}

// releaseDescription is the description text: the file of the job's
// artifacts it names when it names one there, else the text itself (as
// release-cli uses the text when no such file exists).
func (s *Engine) releaseDescription(ctx context.Context, jobID int64, desc string) (string, error) {
	if !ci.DescriptionFile(desc) {
		return desc, nil
	}
	zr, closer, err := pages.JobArchive(ctx, s.store, s.artifacts, jobID)
	if errors.Is(err, pages.ErrNoArchive) {
		return desc, nil
	}
	if err != nil {
		return "", err
	}
	defer closer.Close()
	want := path.Clean(desc)
	for _, f := range zr.File {
		if path.Clean(strings.ReplaceAll(f.Name, "\\", "/")) != want || !f.Mode().IsRegular() {
			continue
		}
		rc, err := f.Open()
		if err != nil {
			return "", err
		}
		defer rc.Close()
		b, err := io.ReadAll(io.LimitReader(rc, maxReleaseDescription+1))
		if err != nil {
			return "", err
		}
		if len(b) > maxReleaseDescription {
			return "", releaseErrorf("release:description file %s is larger than %d bytes", desc, maxReleaseDescription)
		}
		return string(b), nil
	}
	return desc, nil
}

func validReleaseURL(s string) bool {
	return strings.HasPrefix(s, "http://") || strings.HasPrefix(s, "https://") || strings.HasPrefix(s, "ftp://")
}
