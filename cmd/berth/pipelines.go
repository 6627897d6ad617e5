package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/berthci/berth/coordinator/client"
	"github.com/berthci/berth/coordinator/gitrepo"
	"github.com/berthci/berth/coordinator/restapi"
)

func newPipelinesCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "pipelines", Short: "Start and follow pipelines on a coordinator (admin, or a member of the project with --token)"}
	cmd.AddCommand(newPipelinesCreateCmd(), newPipelinesWaitCmd(), newPipelinesShowCmd(), newPipelinesCancelCmd(), newPipelinesRetryCmd(), newPipelinesDeleteCmd())
	return cmd
}

func newPipelinesCreateCmd() *cobra.Command {
	var (
		af                    adminFlags
		project, ref, message string
		vars                  []string
	)
	cmd := &cobra.Command{
		Use:   "create --project NAME [--ref main] DIR",
		Short: "Commit DIR to a project (created if needed) and start a pipeline; prints the pipeline id",
		Long: `Commit the files of DIR (as git add -A sees them: .gitignore applies) onto a branch of
the project's repository on the coordinator, creating the project if needed, push it over
HTTP with the admin token and -o ci.skip, then start a pipeline for the branch through the
API. Only the pipeline id goes to stdout.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if project == "" {
				return errors.New("--project is required")
			}
			c, err := af.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			proj, err := c.Project(ctx, project)
			if client.IsNotFound(err) {
				proj, err = c.CreateProject(ctx, restapi.CreateProjectRequest{Path: project, DefaultBranch: ref})
				if err == nil {
					fmt.Fprintf(cmd.ErrOrStderr(), "created project %s (id %d)\n", proj.PathWithNamespace, proj.ID)
				}
			}
			if err != nil {
				return err
			}
			if message == "" {
				message = "berth pipelines create " + time.Now().UTC().Format(time.RFC3339)
			}
			sha, err := commitAndPush(ctx, c, proj.PathWithNamespace, ref, args[0], message)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "pushed %s to %s\n", shortSha(sha), ref)
			req := restapi.CreatePipelineRequest{Ref: ref}
			for _, kv := range vars {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					return fmt.Errorf("--var %q: want KEY=VALUE", kv)
				}
				req.Variables = append(req.Variables, restapi.PipelineVariable{Key: k, Value: v})
			}
			pl, err := c.CreatePipeline(ctx, proj.ID, req)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), pl.ID)
			return nil
		},
	}
	af.register(cmd)
	f := cmd.Flags()
	f.StringVar(&project, "project", "", "project path (group/name or name)")
	f.StringVar(&ref, "ref", "main", "branch to commit to and run")
	f.StringVar(&message, "message", "", "commit message")
	f.StringArrayVar(&vars, "var", nil, "pipeline variable KEY=VALUE (repeatable)")
	return cmd
}

// commitAndPush commits dir on top of the project's branch (fetched
// shallowly) in a temporary repository and pushes it with ci.skip. It
// returns the commit now at the branch.
func commitAndPush(ctx context.Context, c *client.Client, project, branch, dir, message string) (string, error) {
	tmp, err := os.MkdirTemp("", "berth-push-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	repo, err := gitrepo.Init(ctx, tmp, branch)
	if err != nil {
		return "", err
	}
	remote := gitrepo.Remote{URL: strings.TrimSuffix(c.BaseURL, "/") + "/" + project + ".git", User: "berth", Password: c.Token}
	if err := gitrepo.FetchBranch(ctx, repo.Dir, remote, branch, 1); err != nil && !errors.Is(err, gitrepo.ErrNotFound) {
		return "", err
	}
	sha, created, err := gitrepo.CommitDir(ctx, repo.Dir, dir, branch, message, gitrepo.Author{})
	if err != nil {
		return "", err
	}
	if created {
		if err := gitrepo.Push(ctx, repo.Dir, remote, branch, "ci.skip"); err != nil {
			return "", err
		}
	}
	return sha, nil
}

func shortSha(s string) string {
	if len(s) > 8 {
		return s[:8]
	}
	return s
}

// jobEvent is one line of berth pipelines wait --json.
type jobEvent struct {
	JobID    int64  `json:"job_id"`
	Name     string `json:"name"`
	Stage    string `json:"stage"`
	Status   string `json:"status"`
	Previous string `json:"previous,omitempty"`
	// Retry is set on a job that replaced an earlier one of its name.
	Retry bool `json:"retry,omitempty"`
}

// pipelineEvent is the last line of berth pipelines wait --json.
type pipelineEvent struct {
	PipelineID int64  `json:"pipeline_id"`
	Status     string `json:"status"`
}

func newPipelinesWaitCmd() *cobra.Command {
	var (
		af       adminFlags
		asJSON   bool
		interval time.Duration
		timeout  time.Duration
	)
	cmd := &cobra.Command{
		Use:   "wait ID",
		Short: "Print each job's state changes until the pipeline ends; exit 0 on success, 1 otherwise",
		Long: `Follow a pipeline: print a line for every job state change, and the pipeline's final
status. Exits 0 when the pipeline succeeded, 1 when it failed, was canceled or skipped.
A pipeline blocked on a manual job keeps waiting (play the job, or cancel the pipeline).
With --json, every line is a JSON object: {"job_id","name","stage","status","previous"}
per change, then {"pipeline_id","status"}.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseID(args[0])
			if err != nil {
				return err
			}
			c, err := af.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			if timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, timeout)
				defer cancel()
			}
			status, err := waitPipeline(ctx, c, id, interval, cmd.OutOrStdout(), asJSON)
			if err != nil {
				return err
			}
			if status != "success" {
				return &exitError{code: 1, err: fmt.Errorf("pipeline %d %s", id, status)}
			}
			return nil
		},
	}
	af.register(cmd)
	af.registerUserToken(cmd, "a member of the pipeline's project")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON lines")
	cmd.Flags().DurationVar(&interval, "interval", time.Second, "how often to poll")
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "give up after this long (0: never)")
	return cmd
}

func parseID(s string) (int64, error) {
	var id int64
	if _, err := fmt.Sscan(s, &id); err != nil || id <= 0 || fmt.Sprint(id) != s {
		return 0, fmt.Errorf("%q is not an id", s)
	}
	return id, nil
}

// pipelineFinished are the statuses wait stops at.
var pipelineFinished = map[string]bool{"success": true, "failed": true, "canceled": true, "skipped": true}

// waitPipeline polls a pipeline and its jobs, printing job state changes,
// until the pipeline finishes; it returns the final status.
func waitPipeline(ctx context.Context, c *client.Client, id int64, interval time.Duration, w io.Writer, asJSON bool) (string, error) {
	seen := map[int64]string{}
	names := map[string]bool{}
	blocked := false
	enc := json.NewEncoder(w)
	for {
		pl, err := c.Pipeline(ctx, id)
		if err != nil {
			return "", err
		}
		jobs, err := c.PipelineJobs(ctx, pl.ProjectID, id)
		if err != nil {
			return "", err
		}
		for _, j := range jobs { // by id: oldest first
			prev, known := seen[j.ID]
			if known && prev == j.Status {
				continue
			}
			ev := jobEvent{JobID: j.ID, Name: j.Name, Stage: j.Stage, Status: j.Status, Previous: prev, Retry: !known && names[j.Name]}
			seen[j.ID] = j.Status
			names[j.Name] = true
			if asJSON {
				if err := enc.Encode(ev); err != nil {
					return "", err
				}
				continue
			}
			line := fmt.Sprintf("job %d %s (%s): %s", j.ID, j.Name, j.Stage, j.Status)
			if prev != "" {
				line = fmt.Sprintf("job %d %s (%s): %s → %s", j.ID, j.Name, j.Stage, prev, j.Status)
			} else if ev.Retry {
				line += " (retry)"
			}
			if j.Status == "failed" && j.AllowFailure {
				line += " (allowed to fail)"
			}
			fmt.Fprintln(w, line)
		}
		if pipelineFinished[pl.Status] {
			if asJSON {
				return pl.Status, enc.Encode(pipelineEvent{PipelineID: id, Status: pl.Status})
			}
			fmt.Fprintf(w, "pipeline %d: %s\n", id, pl.Status)
			return pl.Status, nil
		}
		if pl.Status == "manual" && !blocked && !asJSON {
			fmt.Fprintf(w, "pipeline %d waits for a manual job (berth jobs play ID)\n", id)
		}
		blocked = pl.Status == "manual"
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("waiting for pipeline %d: %w", id, ctx.Err())
		case <-time.After(interval):
		}
	}
}

func newPipelinesCancelCmd() *cobra.Command {
	var af adminFlags
	cmd := &cobra.Command{
		Use:   "cancel ID",
		Short: "Cancel a pipeline's jobs",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return pipelineAction(cmd, &af, args[0], (*client.Client).CancelPipeline)
		},
	}
	af.register(cmd)
	af.registerUserToken(cmd, "a member of the pipeline's project")
	return cmd
}

func newPipelinesRetryCmd() *cobra.Command {
	var af adminFlags
	cmd := &cobra.Command{
		Use:   "retry ID",
		Short: "Retry a pipeline's failed and canceled jobs",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return pipelineAction(cmd, &af, args[0], (*client.Client).RetryPipeline)
		},
	}
	af.register(cmd)
	af.registerUserToken(cmd, "a member of the pipeline's project")
	return cmd
}

func newPipelinesDeleteCmd() *cobra.Command {
	var (
		af      adminFlags
		project string
	)
	cmd := &cobra.Command{
		Use:   "delete ID",
		Short: "Delete a pipeline, its jobs, their logs, artifacts and VM snapshots (a running one is canceled first)",
		Long: `Delete a pipeline for good, as GitLab's DELETE /projects/:id/pipelines/:pipeline_id: its jobs,
their logs, artifacts and VM snapshots leave the coordinator's store and artifact storage. A
running pipeline is canceled first. Pages sites its jobs published stay, as do its child
pipelines. Instance admins, and the project's owners (--token), may.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseID(args[0])
			if err != nil {
				return err
			}
			c, err := af.client()
			if err != nil {
				return err
			}
			if project == "" {
				pl, err := c.Pipeline(cmd.Context(), id)
				if err != nil {
					return fmt.Errorf("finding pipeline %d's project (or pass --project): %w", id, err)
				}
				project = strconv.FormatInt(pl.ProjectID, 10)
			}
			if err := c.DeletePipeline(cmd.Context(), project, id); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "pipeline %d: deleted\n", id)
			return nil
		},
	}
	af.register(cmd)
	af.registerUserToken(cmd, "an owner of the project")
	cmd.Flags().StringVar(&project, "project", "", "the pipeline's project (id or path; default: looked up)")
	return cmd
}

func pipelineAction(cmd *cobra.Command, af *adminFlags, arg string,
	act func(*client.Client, context.Context, int64, int64) (*restapi.PipelineJSON, error)) error {
	id, err := parseID(arg)
	if err != nil {
		return err
	}
	c, err := af.client()
	if err != nil {
		return err
	}
	pl, err := c.Pipeline(cmd.Context(), id)
	if err != nil {
		return err
	}
	out, err := act(c, cmd.Context(), pl.ProjectID, id)
	if err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "pipeline %d: %s\n", out.ID, out.Status)
	return nil
}

// pipelineTree is a pipeline with its jobs and its trigger jobs, each
// with the downstream pipeline it created (berth pipelines show --json).
type pipelineTree struct {
	Pipeline restapi.PipelineJSON `json:"pipeline"`
	Jobs     []restapi.JobJSON    `json:"jobs"`
	Bridges  []bridgeTree         `json:"bridges"`
}

type bridgeTree struct {
	restapi.BridgeJSON
	Downstream *pipelineTree `json:"downstream,omitempty"`
}

// maxTreeDepth bounds how far show follows downstream pipelines (GitLab
// nests child pipelines two deep; multi-project chains are bounded by
// loop detection).
const maxTreeDepth = 10

func newPipelinesShowCmd() *cobra.Command {
	var (
		af     adminFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "show ID",
		Short: "Print a pipeline's jobs and trigger jobs, with their downstream pipelines as a tree",
		Long: `Print a pipeline, its jobs (latest attempts) with stage and status, and its trigger jobs
with the downstream pipeline each created (child or multi-project), whose jobs are printed
nested under it, recursively. --json prints {pipeline, jobs, bridges[{…, downstream}]}.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseID(args[0])
			if err != nil {
				return err
			}
			c, err := af.client()
			if err != nil {
				return err
			}
			t, err := loadPipelineTree(cmd.Context(), c, id, 0)
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(t)
			}
			printPipelineTree(cmd.OutOrStdout(), t, "")
			return nil
		},
	}
	af.register(cmd)
	af.registerUserToken(cmd, "a member of the pipeline's project")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func loadPipelineTree(ctx context.Context, c *client.Client, id int64, depth int) (*pipelineTree, error) {
	pl, err := c.Pipeline(ctx, id)
	if err != nil {
		return nil, err
	}
	jobs, err := c.PipelineJobs(ctx, pl.ProjectID, id)
	if err != nil {
		return nil, err
	}
	bridges, err := c.PipelineBridges(ctx, pl.ProjectID, id)
	if err != nil {
		return nil, err
	}
	t := &pipelineTree{Pipeline: *pl, Jobs: []restapi.JobJSON{}, Bridges: []bridgeTree{}}
	for _, j := range jobs {
		if !j.Retried {
			t.Jobs = append(t.Jobs, j)
		}
	}
	for _, b := range bridges {
		if b.Retried {
			continue
		}
		bt := bridgeTree{BridgeJSON: b}
		if b.DownstreamPipeline != nil && depth < maxTreeDepth {
			if bt.Downstream, err = loadPipelineTree(ctx, c, b.DownstreamPipeline.ID, depth+1); err != nil {
				return nil, err
			}
		}
		t.Bridges = append(t.Bridges, bt)
	}
	return t, nil
}

// printPipelineTree prints a pipeline's jobs and trigger jobs in the
// order they were created, a downstream pipeline indented under its
// trigger job.
func printPipelineTree(w io.Writer, t *pipelineTree, indent string) {
	p := t.Pipeline
	fmt.Fprintf(w, "%spipeline #%d %s (project %d, %s %s, source %s)\n", indent, p.ID, p.Status, p.ProjectID, p.Ref, shortSha(p.Sha), p.Source)
	type row struct {
		id                  int64
		name, stage, status string
		bridge              *bridgeTree
	}
	var rows []row
	for _, j := range t.Jobs {
		st := j.Status
		if j.Status == "failed" && j.AllowFailure {
			st += " (allowed to fail)"
		}
		rows = append(rows, row{id: j.ID, name: j.Name, stage: j.Stage, status: st})
	}
	for i := range t.Bridges {
		b := &t.Bridges[i]
		st := b.Status
		if b.Status == "failed" && b.AllowFailure {
			st += " (allowed to fail)"
		}
		if b.FailureReason != "" {
			st += " [" + b.FailureReason + "]"
		}
		rows = append(rows, row{id: b.ID, name: b.Name, stage: b.Stage, status: st, bridge: b})
	}
	sort.Slice(rows, func(a, b int) bool { return rows[a].id < rows[b].id })
	nameW, stageW := 0, 0
	for _, r := range rows {
		nameW, stageW = max(nameW, len(r.name)), max(stageW, len(r.stage))
	}
	for _, r := range rows {
		line := fmt.Sprintf("%s  %-*s  %-*s  %s", indent, nameW, r.name, stageW, r.stage, r.status)
		if r.bridge != nil {
			line += "  (trigger"
			if d := r.bridge.DownstreamPipeline; d != nil {
				line += fmt.Sprintf(" → pipeline #%d", d.ID)
			}
			line += ")"
		}
		fmt.Fprintln(w, strings.TrimRight(line, " "))
		if r.bridge != nil && r.bridge.Downstream != nil {
			printPipelineTree(w, r.bridge.Downstream, indent+"    ")
		}
	}
}
