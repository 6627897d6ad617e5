package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/berthci/berth/ci"
	"github.com/berthci/berth/coordinator/dispatch"
)

func newCICmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "ci",
		Short: "Work with .gitlab-ci.yml files",
	}
	cmd.AddCommand(newCILintCmd())
	return cmd
}

type ciLintOptions struct {
	file          string
	root          string
	ref           string
	tag           bool
	source        string
	defaultBranch string
	vars          []string
	inputs        []string
	includeDir    string
	json          bool
	project       string
	serverURL     string
	targetBranch  string
}

func newCILintCmd() *cobra.Command {
	var o ciLintOptions
	cmd := &cobra.Command{
		Use:   "lint [FILE]",
		Short: "Validate a CI file offline and print its jobs",
		Long: `Validate a .gitlab-ci.yml (default ./.gitlab-ci.yml) with its local includes,
without a server, and print the pipeline it gives for a ref and variables:
each job's stage, name, needs, when and rules outcome. Invalid files print
every error as file:line:col: message and exit 1.

Local includes are read relative to the repository root: the directory of
FILE unless --root is given. When the root is in a git work tree, the
CI_COMMIT_* variables are its HEAD commit's and rules:changes:compare_to
compares HEAD with its merge base with that ref (also tried as origin/REF),
as do all rules:changes of a merge request pipeline with its target branch;
other rules:changes clauses are true (no diff, as GitLab does for a new
branch). rules:exists looks at the files under the root; cache:key:files
keys are digests of the files' contents. --source merge_request_event
lints a merge request pipeline: CI_MERGE_REQUEST_* variables are set (the
ref is the source branch) and CI_COMMIT_BRANCH is not, as in GitLab.

A component of the linted project itself at the commit under lint
($CI_SERVER_FQDN/$CI_PROJECT_PATH/NAME@$CI_COMMIT_SHA, how GitLab tests a
component in its own project) is read from the root's templates/.
include:project, remote, template and component files are read from
--include-dir DIR, a local mirror:

  DIR/remote/HOST/PATH                   include:remote https://HOST/PATH
  DIR/templates/NAME                     include:template NAME (copy GitLab's
                                         lib/gitlab/ci/templates here)
  DIR/projects/GROUP/PROJECT@REF/FILE    include:project with ref: REF
  DIR/projects/GROUP/PROJECT/FILE        include:project at any other ref
  DIR/projects/GROUP/PROJECT@VERSION/templates/NAME.yml
                                         include:component .../NAME@VERSION
                                         (~latest and 1 / 1.2 choose among
                                         the PROJECT@TAG directories)

An include the mirror does not hold is reported once as unresolved, with
where to put it; the rest is still validated (names the missing file could
define are not reported missing) and the exit status stays 0.

--input K=V gives a pipeline input for a spec:inputs header of FILE; V is
read as the input's type (3, true, [a, b]).`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.file = ".gitlab-ci.yml"
			if len(args) == 1 {
				o.file = args[0]
			}
			return runCILint(cmd.Context(), cmd.OutOrStdout(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.root, "root", "", "repository root for local includes (default: the directory of FILE)")
	f.StringVar(&o.ref, "ref", "main", "branch or tag the pipeline runs for")
	f.BoolVar(&o.tag, "tag", false, "the ref is a tag (sets CI_COMMIT_TAG instead of CI_COMMIT_BRANCH)")
	f.StringVar(&o.source, "source", "push", "CI_PIPELINE_SOURCE (push, web, schedule, api, trigger, merge_request_event, ...)")
	f.StringVar(&o.defaultBranch, "default-branch", "main", "CI_DEFAULT_BRANCH")
	f.StringArrayVar(&o.vars, "var", nil, "variable K=V for rules (repeatable; wins over YAML variables)")
	f.StringArrayVar(&o.inputs, "input", nil, "pipeline input K=V for FILE's spec:inputs (repeatable)")
	f.StringVar(&o.includeDir, "include-dir", "", "local mirror of project, remote, template and component includes (layout in --help)")
	f.StringVar(&o.project, "project", "", "CI_PROJECT_PATH (default: from the root's git remote origin, else local/DIR)")
	f.StringVar(&o.serverURL, "server-url", "", "CI_SERVER_URL (default: from the root's git remote origin, else http://localhost)")
	f.StringVar(&o.targetBranch, "target-branch", "", "with --source merge_request_event: the merge request's target branch (default: --default-branch)")
	f.BoolVar(&o.json, "json", false, "print a machine-readable result")
	return cmd
}

var scpLikeRe = regexp.MustCompile(`^(?:[^@/]+@)?([^:/]+):(.+)$`)

// originProject reads the root's git remote origin URL (.git/config) and
// returns the server URL and project path it names, or "" when there is
// none. scp-like (git@host:group/p.git), ssh:// and http(s):// URLs.
func originProject(root string) (server, project string) {
	b, err := os.ReadFile(filepath.Join(root, ".git", "config"))
	if err != nil {
		return "", ""
	}
	inOrigin := false
	var raw string
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "[") {
			inOrigin = line == `[remote "origin"]`
			continue
		}
		if k, v, ok := strings.Cut(line, "="); ok && inOrigin && strings.TrimSpace(k) == "url" {
			raw = strings.TrimSpace(v)
			break
		}
	}
	if raw == "" {
		return "", ""
	}
	var host, p string
	if u, err := url.Parse(raw); err == nil && u.Host != "" {
		host, p = u.Hostname(), u.Path
		if u.Scheme == "http" || u.Scheme == "https" {
			host = u.Scheme + "://" + u.Host
		} else {
			host = "https://" + host
		}
	} else if m := scpLikeRe.FindStringSubmatch(raw); m != nil {
		host, p = "https://"+m[1], m[2]
	} else {
		return "", ""
	}
	p = strings.TrimSuffix(strings.Trim(p, "/"), ".git")
	if p == "" {
		return "", ""
	}
	return host, p
}

// projectVars are the predefined variables of the project and server
// that rules and includes read (include:rules: if: $CI_PROJECT_PATH …,
// component: $CI_SERVER_FQDN/…).
func projectVars(serverURL, project string) (map[string]string, error) {
	u, err := url.Parse(serverURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("--server-url %q: want http(s)://host[:port]", serverURL)
	}
	project = strings.Trim(project, "/")
	if project == "" || strings.Contains(project, "//") {
		return nil, fmt.Errorf("--project %q: want GROUP/PROJECT", project)
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	base := strings.TrimSuffix(u.String(), "/")
	name, namespace := path.Base(project), path.Dir(project)
	if namespace == "." {
		namespace = ""
	}
	return map[string]string{
		"CI_SERVER_URL": base, "CI_SERVER_HOST": u.Hostname(), "CI_SERVER_FQDN": u.Host,
		"CI_SERVER_PROTOCOL": u.Scheme, "CI_SERVER_PORT": port, "CI_API_V4_URL": base + "/api/v4",
		"CI_PROJECT_PATH": project, "CI_PROJECT_PATH_SLUG": ci.Slug(project, 1024), "CI_PROJECT_NAME": name,
		"CI_PROJECT_NAMESPACE": namespace, "CI_PROJECT_ROOT_NAMESPACE": strings.Split(project, "/")[0],
		"CI_PROJECT_URL": base + "/" + project,
	}, nil
}

// lintEnv is the pipeline's environment for the file at configPath in
// root (whose files fsys holds).
func lintEnv(ctx context.Context, o ciLintOptions, root, configPath string, fsys fs.FS) (ci.Env, error) {
	pre := map[string]string{
		"CI":                        "true",
		"GITLAB_CI":                 "true",
		"CI_SERVER":                 "yes",
		"CI_SERVER_NAME":            "Berth",
		"CI_COMMIT_REF_NAME":        o.ref,
		"CI_COMMIT_REF_SLUG":        ci.Slug(o.ref, 63),
		"CI_COMMIT_REF_PROTECTED":   strconv.FormatBool(!o.tag && o.ref == o.defaultBranch), // GitLab protects the default branch
		"CI_PIPELINE_SOURCE":        o.source,
		"CI_DEFAULT_BRANCH":         o.defaultBranch,
		"CI_CONFIG_PATH":            filepath.ToSlash(configPath),
		"CI_TEMPLATE_REGISTRY_HOST": dispatch.TemplateRegistryHost,
	}
	git, head := openLintGit(ctx, root)
	if o.source == "merge_request_event" {
		git.mrTarget = cmp.Or(o.targetBranch, o.defaultBranch)
	}
	commitVars(head, pre)
	server, project := o.serverURL, o.project
	if server == "" || project == "" {
		oServer, oProject := originProject(root)
		if server == "" {
			server = oServer
		}
		if project == "" {
			project = oProject
		}
		if server == "" {
			server = "http://localhost"
		}
		if project == "" {
			dir := "project"
			if abs, err := filepath.Abs(root); err == nil && filepath.Base(abs) != string(filepath.Separator) {
				dir = filepath.Base(abs)
			}
			project = "local/" + dir
		}
	}
	pv, err := projectVars(server, project)
	if err != nil {
		return ci.Env{}, err
	}
	for k, v := range pv {
		pre[k] = v
	}
	switch {
	case o.source == "merge_request_event":
		mergeRequestVars(o, pre)
	case o.tag:
		pre["CI_COMMIT_TAG"] = o.ref
	default:
		pre["CI_COMMIT_BRANCH"] = o.ref
	}
	vars := map[string]string{}
	for _, kv := range o.vars {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return ci.Env{}, fmt.Errorf("--var %q: want KEY=VALUE", kv)
		}
		vars[k] = v
	}
	inputs := map[string]any{}
	for _, kv := range o.inputs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return ci.Env{}, fmt.Errorf("--input %q: want KEY=VALUE", kv)
		}
		inputs[k] = v
	}
	return ci.Env{
		Predefined: pre,
		Variables:  vars,
		Inputs:     inputs,
		Exists:     ci.FSExists(fsys),
		CacheKey:   lintCacheKey(trackedFiles(ctx, root, fsys), git),
		Changes:    git.changes,
	}, nil
}

// relPath is file's path inside root, either of them relative to the
// current directory or absolute.
func relPath(root, file string) (string, error) {
	r, err := filepath.Abs(root)
	if err != nil {
		return "", err
	}
	f, err := filepath.Abs(file)
	if err != nil {
		return "", err
	}
	return filepath.Rel(r, f)
}

// mergeRequestVars are a merge request pipeline's variables (GitLab sets
// CI_MERGE_REQUEST_* and no CI_COMMIT_BRANCH): merge request !1 of the
// project from the ref to the target branch.
func mergeRequestVars(o ciLintOptions, pre map[string]string) {
	target := cmp.Or(o.targetBranch, o.defaultBranch)
	project, projectURL := pre["CI_PROJECT_PATH"], pre["CI_PROJECT_URL"]
	for k, v := range map[string]string{
		"CI_MERGE_REQUEST_ID": "1", "CI_MERGE_REQUEST_IID": "1",
		"CI_MERGE_REQUEST_EVENT_TYPE":              "detached",
		"CI_MERGE_REQUEST_SOURCE_BRANCH_NAME":      o.ref,
		"CI_MERGE_REQUEST_TARGET_BRANCH_NAME":      target,
		"CI_MERGE_REQUEST_TARGET_BRANCH_PROTECTED": strconv.FormatBool(target == o.defaultBranch),
		"CI_MERGE_REQUEST_PROJECT_ID":              pre["CI_PROJECT_ID"],
		"CI_MERGE_REQUEST_PROJECT_PATH":            project,
		"CI_MERGE_REQUEST_PROJECT_URL":             projectURL,
		"CI_MERGE_REQUEST_SOURCE_PROJECT_PATH":     project,
		"CI_MERGE_REQUEST_SOURCE_PROJECT_URL":      projectURL,
		"CI_MERGE_REQUEST_REF_PATH":                "refs/merge-requests/1/head",
		"CI_MERGE_REQUEST_TITLE":                   pre["CI_COMMIT_TITLE"],
		"CI_MERGE_REQUEST_DESCRIPTION":             pre["CI_COMMIT_DESCRIPTION"],
		"CI_OPEN_MERGE_REQUESTS":                   project + "!1",
	} {
		if v != "" {
			pre[k] = v
		}
	}
}

// lintCacheKey computes cache keys as the coordinator would for a commit
// of the work tree fsys (its tracked files, trackedFiles): cache:key:files
// from the files' contents (what they would hash to once committed),
// files_commits from the last commits
// of the work tree's repository (none outside one: the key is "default").
func lintCacheKey(fsys fs.FS, g *lintGit) ci.CacheKeyFunc {
	if g.repo == nil {
		return ci.FSCacheKey(fsys, nil)
	}
	return ci.FSCacheKey(fsys, func(ctx context.Context, path string) (string, error) {
		return g.repo.LastCommitTouching(ctx, g.head, path)
	})
}

type lintError struct {
	File    string `json:"file"`
	Line    int    `json:"line"`
	Col     int    `json:"col"`
	Message string `json:"message"`
}

type lintResult struct {
	Valid    bool        `json:"valid"`
	File     string      `json:"file"`
	Ref      string      `json:"ref"`
	Errors   []lintError `json:"errors"`
	Warnings []lintError `json:"warnings"`
	// Unresolved are the includes the mirror (--include-dir) did not
	// hold: the result is valid without them.
	Unresolved []ci.UnresolvedInclude `json:"unresolved_includes"`
	Pipeline   *ci.Pipeline           `json:"pipeline,omitempty"`
}

func runCILint(ctx context.Context, out io.Writer, o ciLintOptions) error {
	root := o.root
	if root == "" {
		root = filepath.Dir(o.file)
	}
	rel, err := relPath(root, o.file)
	if err != nil || strings.HasPrefix(rel, "..") {
		return fmt.Errorf("ci lint: %s is not inside the root %s", o.file, root)
	}
	fsys := os.DirFS(root)
	env, err := lintEnv(ctx, o, root, rel, fsys)
	if err != nil {
		return fmt.Errorf("ci lint: %w", err)
	}
	var mirror fs.FS
	if o.includeDir != "" {
		if st, err := os.Stat(o.includeDir); err != nil || !st.IsDir() {
			return fmt.Errorf("ci lint: --include-dir %s is not a directory", o.includeDir)
		}
		mirror = os.DirFS(o.includeDir)
	}
	resolver := ci.NewDirResolver(mirror, o.includeDir)
	pre := env.Predefined
	env.Includes = selfComponents{DirResolver: resolver, root: fsys, hosts: []string{pre["CI_SERVER_FQDN"], pre["CI_SERVER_HOST"]},
		project: pre["CI_PROJECT_PATH"], sha: pre["CI_COMMIT_SHA"], ref: o.ref}
	// rules:exists with project: the linted project is the work tree,
	// another one its directory in the mirror.
	exists := env.Exists
	env.ExistsIn = func(ctx context.Context, project, ref string, patterns []string) (bool, error) {
		if strings.EqualFold(project, pre["CI_PROJECT_PATH"]) && exists != nil {
			return exists(ctx, patterns)
		}
		return resolver.ExistsIn(ctx, project, ref, patterns)
	}
	// Positions of the repository's files are shown from the current
	// directory; mirror files already are.
	show := func(p ci.Pos) ci.Pos {
		if p.File == "" || root == "." {
			return p
		}
		if _, err := fs.Stat(fsys, p.File); err == nil {
			p.File = filepath.Join(root, filepath.FromSlash(p.File))
		}
		return p
	}
	p, err := ci.Compile(ctx, ci.Source{FS: fsys, Path: filepath.ToSlash(rel)}, env)
	res := lintResult{File: o.file, Ref: o.ref, Errors: []lintError{}, Warnings: []lintError{}}
	res.Unresolved = resolver.Unresolved()
	var list ci.ErrorList
	switch {
	case errors.As(err, &list):
		for _, e := range list {
			sp := show(e.Pos)
			res.Errors = append(res.Errors, lintError{File: sp.File, Line: sp.Line, Col: sp.Col, Message: e.Msg})
		}
	case err != nil:
		return fmt.Errorf("ci lint: %w", err)
	default:
		res.Valid = true
		res.Pipeline = p
		for _, w := range p.Warnings {
			sp := show(w.Pos)
			res.Warnings = append(res.Warnings, lintError{File: sp.File, Line: sp.Line, Col: sp.Col, Message: w.Msg})
		}
	}
	if o.json {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(res); err != nil {
			return fmt.Errorf("ci lint: writing result: %w", err)
		}
	} else {
		printLint(out, res)
	}
	if !res.Valid {
		return &exitError{code: 1, err: fmt.Errorf("ci lint: %s is invalid (%d errors)", o.file, len(res.Errors))}
	}
	return nil
}

// maxNeedsShown is how many needs a job's row of berth ci lint names.
const maxNeedsShown = 4

func printLint(out io.Writer, res lintResult) {
	unresolved := func() {
		for _, u := range res.Unresolved {
			fmt.Fprintf(out, "unresolved include:%s %s: not checked; %s (--include-dir)\n", u.Kind, u.Include, u.Hint)
		}
	}
	if !res.Valid {
		for _, e := range res.Errors {
			fmt.Fprintf(out, "%s:%d:%d: %s\n", e.File, e.Line, e.Col, e.Message)
		}
		unresolved()
		return
	}
	p := res.Pipeline
	fmt.Fprintf(out, "%s is valid\n", res.File)
	if p.Created {
		fmt.Fprintf(out, "pipeline for %s: created", res.Ref)
	} else {
		fmt.Fprintf(out, "pipeline for %s: not created (%s)", res.Ref, p.Reason)
	}
	if p.WorkflowRule >= 0 {
		fmt.Fprintf(out, ", workflow rule %d matched", p.WorkflowRule+1)
	}
	fmt.Fprintln(out)
	fmt.Fprintf(out, "stages: %s\n", strings.Join(p.Stages, ", "))
	if len(p.Jobs) > 0 || len(p.Excluded) > 0 {
		fmt.Fprintln(out)
		tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "STAGE\tJOB\tWHEN\tNEEDS\tRULES")
		row := func(j *ci.Job) {
			when := string(j.When)
			if j.When == ci.Delayed {
				when += " " + j.StartIn.String()
			}
			if j.AllowFailure || len(j.AllowFailureExitCodes) > 0 {
				when += " (allow failure)"
			}
			needs := "-"
			if j.Scheduling == ci.ScheduleDAG {
				var n []string
				for _, x := range j.Needs {
					n = append(n, x.Job)
				}
				// A long list would widen every row of the table: the
				// first few, and how many more (--json has them all).
				if len(n) > maxNeedsShown {
					n = append(n[:maxNeedsShown], fmt.Sprintf("… %d more", len(n)-maxNeedsShown))
				}
				needs = "[" + strings.Join(n, ", ") + "]"
			}
			name := j.Name
			if j.Trigger != nil {
				name += " " + describeTrigger(j.Trigger)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", j.Stage, name, when, needs, j.Rules)
		}
		for _, j := range p.Jobs {
			row(j)
		}
		for _, j := range p.Excluded {
			row(j)
		}
		tw.Flush()
	}
	if len(res.Warnings) > 0 || len(res.Unresolved) > 0 {
		fmt.Fprintln(out)
		for _, w := range res.Warnings {
			fmt.Fprintf(out, "warning: %s:%d:%d: %s\n", w.File, w.Line, w.Col, w.Message)
		}
		unresolved()
	}
}

// describeTrigger shows what a trigger job (a bridge) starts: "→ child
// pipeline (a.yml, artifact x.yml of gen)" or "→ project group/p@branch",
// with its strategy.
func describeTrigger(t *ci.Trigger) string {
	var out string
	if t.Child() {
		var incs []string
		for _, inc := range t.Include {
			switch {
			case inc.Local != "":
				incs = append(incs, inc.Local)
			case inc.Artifact != "":
				incs = append(incs, "artifact "+inc.Artifact+" of "+inc.Job)
			case inc.Project != "":
				incs = append(incs, inc.Project+":"+strings.Join(inc.File, ","))
			default:
				incs = append(incs, inc.Remote+inc.Template+inc.Component)
			}
		}
		out = "→ child pipeline (" + strings.Join(incs, ", ") + ")"
	} else {
		out = "→ project " + t.Project
		if t.Branch != "" {
			out += "@" + t.Branch
		}
	}
	if t.Strategy != "" {
		out += ", strategy " + t.Strategy
	}
	return "[" + out + "]"
}
