package testreport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/berthci/berth/coordinator/artifacts"
	"github.com/berthci/berth/coordinator/graph"
	"github.com/berthci/berth/coordinator/store"
)

// OfPipeline reads the JUnit reports of a pipeline's latest jobs (not
// retried ones, as GitLab's latest_test_report_builds), a suite per job
// name (parallel jobs share theirs), in job order. An expired or erased
// report is left out; one that cannot be read is its suite's error.
func OfPipeline(ctx context.Context, st store.Store, storage artifacts.Storage, pipelineID int64, now time.Time) ([]*Suite, error) {
	jobs, err := st.ListJobs(ctx, store.JobFilter{PipelineID: pipelineID})
	if err != nil {
		return nil, err
	}
	var suites []*Suite
	byName := map[string]*Suite{}
	for _, j := range jobs {
		if j.Retried || graph.IsBridge(j) {
			continue
		}
		arts, err := st.ListArtifacts(ctx, j.ID)
		if err != nil {
			return nil, fmt.Errorf("artifacts of job %d: %w", j.ID, err)
		}
		for _, a := range arts {
			if a.Type != "junit" || !a.ExpireAt.IsZero() && !a.ExpireAt.After(now) {
				continue
			}
			data, err := readReport(ctx, storage, a)
			if errors.Is(err, artifacts.ErrNotFound) {
				continue
			}
			if err != nil {
				return nil, err
			}
			name := SuiteName(j.Name)
			suite := byName[name]
			if suite == nil {
				suite = &Suite{Name: name}
				byName[name] = suite
				suites = append(suites, suite)
			}
			if n := len(suite.JobIDs); n == 0 || suite.JobIDs[n-1] != j.ID {
				suite.JobIDs = append(suite.JobIDs, j.ID)
			}
			if data == nil {
				suite.Error = fmt.Sprintf("JUnit data parsing failed: the report of job %d is larger than %d bytes", j.ID, MaxText)
				continue
			}
			from := len(suite.Cases)
			ReadArtifact(suite, data, a.Format)
			for i := from; i < len(suite.Cases); i++ {
				suite.Cases[i].JobID = j.ID
			}
		}
	}
	for _, suite := range suites {
		suite.Done()
	}
	return suites, nil
}

// readReport reads a stored report; nil (and no error) when it is larger
// than a report may be.
func readReport(ctx context.Context, storage artifacts.Storage, a *store.Artifact) ([]byte, error) {
	rc, _, err := storage.Open(ctx, a.StorageKey)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, MaxText+1))
	if err != nil {
		return nil, fmt.Errorf("reading the JUnit report of job %d: %w", a.JobID, err)
	}
	if len(data) > MaxText {
		return nil, nil
	}
	return data, nil
}
