package runner

import (
	"slices"

	"github.com/berthci/berth/runnerapi"
)

// alwaysSupported are the reasons every GitLab accepts.
var alwaysSupported = []string{runnerapi.ScriptFailure, runnerapi.RunnerSystemFailure, runnerapi.JobExecutionTimeout}

// compatibility is the fallback of a reason the coordinator did not list.
var compatibility = map[string]string{
	runnerapi.ImagePullFailure:                runnerapi.RunnerSystemFailure,
	runnerapi.RunnerConfigurationError:        runnerapi.ScriptFailure,
	runnerapi.RunnerExternalDependencyFailure: runnerapi.RunnerSystemFailure,
}

// MapFailureReason maps a failure reason for sending, exactly as
// gitlab-protocol.md §3: empty → script_failure; a reason the job's
// features.failure_reasons lists (or one of the always-supported trio) as
// is; otherwise its compatibility fallback; otherwise unknown_failure.
func MapFailureReason(reason string, supported []string) string {
	if reason == "" {
		return runnerapi.ScriptFailure
	}
	ok := func(r string) bool { return slices.Contains(alwaysSupported, r) || slices.Contains(supported, r) }
	if ok(reason) {
		return reason
	}
	if fb, has := compatibility[reason]; has && ok(fb) {
		return fb
	}
	return runnerapi.UnknownFailure
}
