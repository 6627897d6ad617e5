package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/berthci/berth/coordinator/client"
	"github.com/berthci/berth/coordinator/restapi"
)

// deployListFlags are the flags of the releases, environments and
// deployments list commands.
type deployListFlags struct {
	af      adminFlags
	project string
	asJSON  bool
}

func (f *deployListFlags) register(cmd *cobra.Command) {
	f.af.register(cmd)
	cmd.Flags().StringVar(&f.project, "project", "", "project id or full path (required)")
	cmd.Flags().BoolVar(&f.asJSON, "json", false, "print GitLab's JSON")
	_ = cmd.MarkFlagRequired("project")
}

// listCmd builds a "list" subcommand: fetch gets the list from the
// coordinator, and table prints it for people.
func listCmd[T any](short string, f *deployListFlags, fetch func(cmd *cobra.Command, c *client.Client) ([]T, error), table func(w io.Writer, list []T)) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "list --project PROJECT",
		Short: short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.af.client()
			if err != nil {
				return err
			}
			list, err := fetch(cmd, c)
			if err != nil {
				return err
			}
			if f.asJSON {
				if list == nil {
					list = []T{}
				}
				return json.NewEncoder(cmd.OutOrStdout()).Encode(list)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			table(tw, list)
			return tw.Flush()
		},
	}
	f.register(cmd)
	return cmd
}

func dashIfNil(s *string) string {
	if s == nil || *s == "" {
		return "-"
	}
	return *s
}

func newReleasesCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "releases", Short: "List a project's releases (admin)"}
	var f deployListFlags
	cmd.AddCommand(listCmd("List releases, newest first", &f,
		func(cmd *cobra.Command, c *client.Client) ([]coordinatorRelease, error) {
			return c.ListReleases(cmd.Context(), f.project)
		},
		func(w io.Writer, list []coordinatorRelease) {
			fmt.Fprintln(w, "TAG\tNAME\tCOMMIT\tRELEASED\tLINKS")
			for _, r := range list {
				var links []string
				for _, l := range r.Assets.Links {
					links = append(links, l.Name)
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", r.TagName, r.Name, r.Commit.ShortID, dashIfNil(r.ReleasedAt), strings.Join(links, ","))
			}
		}))
	return cmd
}

func newEnvironmentsCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "environments", Short: "List a project's environments (admin)"}
	var (
		f     deployListFlags
		state string
	)
	list := listCmd("List environments", &f,
		func(cmd *cobra.Command, c *client.Client) ([]coordinatorEnvironment, error) {
			return c.ListEnvironments(cmd.Context(), f.project, state)
		},
		func(w io.Writer, list []coordinatorEnvironment) {
			fmt.Fprintln(w, "ID\tNAME\tSTATE\tTIER\tURL\tAUTO STOP")
			for _, e := range list {
				fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\n", e.ID, e.Name, e.State, e.Tier, dashIfNil(e.ExternalURL), dashIfNil(e.AutoStopAt))
			}
		})
	list.Flags().StringVar(&state, "state", "", "only environments in this state (available or stopped)")
	cmd.AddCommand(list)
	return cmd
}

func newDeploymentsCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "deployments", Short: "List a project's deployments (admin)"}
	var (
		f                   deployListFlags
		environment, status string
	)
	list := listCmd("List deployments, oldest first", &f,
		func(cmd *cobra.Command, c *client.Client) ([]coordinatorDeployment, error) {
			return c.ListDeployments(cmd.Context(), f.project, environment, status)
		},
		func(w io.Writer, list []coordinatorDeployment) {
			fmt.Fprintln(w, "IID\tENVIRONMENT\tSTATUS\tJOB\tREF\tCOMMIT\tFINISHED")
			for _, d := range list {
				env, job := "-", "-"
				if d.Environment != nil {
					env = d.Environment.Name
				}
				if d.Deployable != nil {
					job = fmt.Sprintf("%s (%d)", d.Deployable.Name, d.Deployable.ID)
				}
				fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", d.IID, env, d.Status, job, d.Ref, shortSha(d.Sha), dashIfNil(d.FinishedAt))
			}
		})
	list.Flags().StringVar(&environment, "environment", "", "only deployments to this environment (name)")
	list.Flags().StringVar(&status, "status", "", "only deployments with this status (created, running, success, failed, canceled, skipped)")
	cmd.AddCommand(list)
	return cmd
}

type (
	coordinatorRelease     = restapi.ReleaseJSON
	coordinatorEnvironment = restapi.EnvironmentJSON
	coordinatorDeployment  = restapi.DeploymentJSON
)
