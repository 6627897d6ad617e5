// Package ci is Berth's .gitlab-ci.yml front end: it turns a CI
// configuration and its includes into a validated, expanded pipeline
// graph with GitLab's semantics.
//
// Compile runs the stages GitLab runs, in GitLab's order:
//
//	YAML (anchors, aliases, merge keys, positions kept; a spec: header
//	  document checks the inputs given and $[[ inputs ]] is interpolated)
//	  → include: local, project, remote, template, component (depth first,
//	    included files merged under the includer; all but local through
//	    Env.Includes)
//	  → extends (deep merge)
//	  → !reference
//	  → keywords parsed and validated (defaults, inherit, every job keyword)
//	  → workflow:rules (is there a pipeline?)
//	  → parallel / matrix expansion
//	  → needs and dependencies resolved and checked (existence, stages, cycles)
//	  → job rules (when, allow_failure, start_in, variables)
//	  → final graph: excluded jobs dropped, needs re-checked, dependencies and
//	    isolation level (isolation:, BERTH_ISOLATION) computed
//
// Problems in the configuration come back as an ErrorList of positioned
// errors (file:line:col: message); everything outside the YAML — the
// predefined and project variables, the answers to rules:changes and
// rules:exists, cache:key:files keys, included files from elsewhere —
// comes from Env, so the package does no I/O except reading the given
// fs.FS (and DirResolver's directory, when the caller uses one). Job.RunnerPayload gives the parts
// of the runner job payload that come from the configuration.
//
// Compile is safe for concurrent use. Jobs of one Pipeline (parallel
// instances in particular) may share slices: treat them as read-only.
package ci
