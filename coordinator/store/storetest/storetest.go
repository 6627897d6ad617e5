// Package storetest is the conformance suite of the store contract. Every
// store implementation runs it from its own tests:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) store.Store {
//			s, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "db"))
//			if err != nil {
//				t.Fatal(err)
//			}
//			return s
//		})
//	}
//
// and its benchmarks with Bench, so implementations can be compared.
//
// Where the contract in package store leaves a behaviour open, the suite
// pins one reading of it so that every implementation behaves alike; each
// such decision is written next to the test that checks it and listed in
// the Run documentation.
package storetest

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/store"
)

// Run runs the conformance suite. open must return a fresh, empty store for
// each call; the suite closes it when the (sub)test ends, so open may
// register cleanups of its own (t.TempDir) that run after the close.
// Subtests run in parallel, each with its own store.
//
// Beyond the contract's text the suite requires (decisions where the
// contract is silent):
//
//   - Lookups of a missing record (GetRunner, RunnerByTokenDigest,
//     RegistrationTokenByDigest, GetJob, JobByTokenDigest) return ErrNotFound;
//     an empty digest never matches.
//   - Times round-trip to the microsecond (or better) and come back in UTC;
//     the zero time comes back as the zero time. The store never reads a
//     clock: every time it stores comes from the caller.
//   - Lists are ordered by ID; ExpiredArtifacts by (ExpireAt, ID). A Limit
//     of 0 or less means no limit. Nil and empty slices are equivalent.
//   - UpdateRunner writes Type, GroupID, ProjectIDs, Description,
//     MaintenanceNote, Tags, RunUntagged, Locked, Paused, AccessLevel,
//     MaximumTimeout, Legacy and ContactedAt.
//   - RotateRunnerToken: ErrNotFound for a missing runner, ErrExists if the
//     new digest belongs to another runner.
//   - UpsertRunnerManager: ErrNotFound if the runner is missing; on insert
//     CreatedAt is the caller's CreatedAt, or ContactedAt if that is zero;
//     on update only Info and ContactedAt change.
//   - CreateJob: an empty Status means pending (and j.Status is set);
//     a status that is not Creatable is an error and nothing is stored.
//   - AssignJob also sets UpdatedAt to the assignment time (the runner's
//     request is a sign of life), so ListJobs{UpdatedBefore} finds stale
//     hand-outs.
//   - UnassignJob clears RunnerID, RunnerManagerID, TokenDigest and
//     AssignedAt; a missing job is ErrConflict, as the contract says.
//   - TransitionJob and TouchJob: ErrNotFound for a missing job;
//     TransitionJob with an empty from set is ErrConflict.
//   - Traces: AppendTrace, ResetTrace, TraceInfo and ReadTrace return
//     ErrNotFound for a missing job; a job without a trace has size 0 and
//     CRC 0. AppendTrace with a negative offset is a *RangeError; empty
//     data at the right offset is a no-op. ReadTrace from an offset outside
//     [0, size] is a *RangeError; from size it writes nothing.
//   - PutArtifact: ErrNotFound if the job is missing; every put gets a new
//     ID. DeleteArtifact: ErrNotFound if absent. ExpiredArtifacts: ExpireAt
//     strictly before the given time.
//   - CreatePipeline: an empty Status means created; IIDs count from 1
//     per project. UpdatePipeline: a bogus status is an error.
//   - CreateProject and UpdateProject: an empty Visibility means private
//     (and p.Visibility is set).
//   - RetryJob: a skipped job may be retried too (it is finished).
//   - Environments, deployments, releases and Pages deployments: lookups
//     of a missing record return ErrNotFound; EnsureEnvironment defaults
//     Tier to other and State to available; DueEnvironments and
//     ExpiredPagesDeployments compare strictly before the given time.
//   - Nil pointers and writers are errors, never panics; so is an
//     Assignment with ManagerID 0 (0 means "not handed out").
func Run(t *testing.T, open func(t *testing.T) store.Store) {
	t.Helper()
	tests := []struct {
		name string
		fn   func(t *testing.T, s store.Store)
	}{
		{"Settings", testSettings},
		{"RegistrationTokens", testRegistrationTokens},
		{"RunnerRoundTrip", testRunnerRoundTrip},
		{"RunnerTokenDigestUnique", testRunnerTokenDigestUnique},
		{"RunnerNotFound", testRunnerNotFound},
		{"UpdateRunner", testUpdateRunner},
		{"ListRunners", testListRunners},
		{"RotateRunnerToken", testRotateRunnerToken},
		{"DeleteRunner", testDeleteRunner},
		{"RunnerManagers", testRunnerManagers},
		{"DeleteRunnerManager", testDeleteRunnerManager},
		{"RunnerManagerFleet", testRunnerManagerFleet},
		{"Users", testUsers},
		{"Sessions", testSessions},
		{"ProjectMembers", testProjectMembers},
		{"ChangeProjectMember", testChangeProjectMember},
		{"PipelineSchedules", testPipelineSchedules},
		{"PipelineTriggers", testPipelineTriggers},
		{"DeletePipeline", testDeletePipeline},
		{"CreateJob", testCreateJob},
		{"CreateJobStatus", testCreateJobStatus},
		{"JobNotFound", testJobNotFound},
		{"ListJobs", testListJobs},
		{"AssignJob", testAssignJob},
		{"UnassignJob", testUnassignJob},
		{"TransitionJob", testTransitionJob},
		{"TransitionAssign", testTransitionAssign},
		{"TransitionJobFields", testTransitionJobFields},
		{"TransitionJobIfTokenDigest", testTransitionJobIfTokenDigest},
		{"TouchJob", testTouchJob},
		{"MarkDebugTrace", testMarkDebugTrace},
		{"JobByTokenDigest", testJobByTokenDigest},
		{"TimeRoundTrip", testTimeRoundTrip},
		{"AppendTrace", testAppendTrace},
		{"AppendTraceRange", testAppendTraceRange},
		{"TraceCRC", testTraceCRC},
		{"ResetTrace", testResetTrace},
		{"ReadTrace", testReadTrace},
		{"TraceNotFound", testTraceNotFound},
		{"ArchiveTrace", testArchiveTrace},
		{"PutArtifact", testPutArtifact},
		{"ArtifactsOfType", testArtifactsOfType},
		{"ExpiredArtifacts", testExpiredArtifacts},
		{"DeleteArtifact", testDeleteArtifact},
		{"CopiesAreFresh", testCopiesAreFresh},
		{"NilInputs", testNilInputs},
		{"Projects", testProjects},
		{"Pipelines", testPipelines},
		{"DownstreamPipelines", testDownstreamPipelines},
		{"Variables", testVariables},
		{"PipelineJobStatuses", testPipelineJobStatuses},
		{"CreateJobs", testCreateJobs},
		{"RetryJob", testRetryJob},
		{"Environments", testEnvironments},
		{"Deployments", testDeployments},
		{"Releases", testReleases},
		{"PagesDeployments", testPagesDeployments},
		{"ConcurrentAssign", testConcurrentAssign},
		{"ConcurrentAppendTrace", testConcurrentAppendTrace},
		{"ConcurrentArchiveTrace", testConcurrentArchiveTrace},
		{"ConcurrentTransition", testConcurrentTransition},
		{"ConcurrentCreate", testConcurrentCreate},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := open(t)
			t.Cleanup(func() {
				if err := s.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			})
			tt.fn(t, s)
		})
	}
}

// base is a time with nanoseconds and a non-UTC zone, so the suite checks
// both truncation and conversion.
var base = time.Date(2025, 3, 14, 15, 9, 26, 535897932, time.FixedZone("UTC+5", 5*3600))

func at(d time.Duration) time.Time { return base.Add(d) }

var digestSeq atomic.Int64

// digest returns a fresh token digest, unique within the process.
func digest(t testing.TB) string {
	sum := sha256.Sum256(fmt.Appendf(nil, "%s/%d", t.Name(), digestSeq.Add(1)))
	return hex.EncodeToString(sum[:])
}

// sameTime reports whether got is want to the microsecond and, unless zero,
// in UTC.
func sameTime(got, want time.Time) bool {
	if want.IsZero() {
		return got.IsZero()
	}
	return got.Location() == time.UTC && got.Truncate(time.Microsecond).Equal(want.Truncate(time.Microsecond))
}

var timeType = reflect.TypeFor[time.Time]()

// diff compares two structs (or pointers to structs) field by field: times
// with sameTime, slices with nil equal to empty, everything else with
// reflect.DeepEqual. It returns a description of the differences.
func diff(got, want any) []string {
	gv, wv := reflect.ValueOf(got), reflect.ValueOf(want)
	if gv.Kind() == reflect.Pointer {
		if gv.IsNil() || wv.IsNil() {
			if gv.IsNil() == wv.IsNil() {
				return nil
			}
			return []string{fmt.Sprintf("got %v, want %v", got, want)}
		}
		gv, wv = gv.Elem(), wv.Elem()
	}
	var out []string
	for i := range gv.NumField() {
		f := gv.Type().Field(i)
		g, w := gv.Field(i), wv.Field(i)
		switch {
		case f.Type == timeType:
			gt, wt := g.Interface().(time.Time), w.Interface().(time.Time)
			if !sameTime(gt, wt) {
				out = append(out, fmt.Sprintf("%s: got %v, want %v (UTC, to the µs)", f.Name, gt, wt))
			}
		case f.Type.Kind() == reflect.Slice:
			if g.Len() == 0 && w.Len() == 0 {
				continue
			}
			if !reflect.DeepEqual(g.Interface(), w.Interface()) {
				out = append(out, fmt.Sprintf("%s: got %v, want %v", f.Name, g.Interface(), w.Interface()))
			}
		default:
			if !reflect.DeepEqual(g.Interface(), w.Interface()) {
				out = append(out, fmt.Sprintf("%s: got %#v, want %#v", f.Name, g.Interface(), w.Interface()))
			}
		}
	}
	return out
}

// check fails t if got and want differ (see diff).
func check(t testing.TB, what string, got, want any) {
	t.Helper()
	for _, d := range diff(got, want) {
		t.Errorf("%s: %s", what, d)
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// wantErr fails t unless errors.Is(err, target).
func wantErr(t testing.TB, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Errorf("%s: got error %v, want %v", what, err, target)
	}
}
