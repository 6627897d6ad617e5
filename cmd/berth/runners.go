package main

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/berthci/berth/coordinator/client"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/runnerapi"
)

// adminFlags are the flags of every command that talks to the admin API.
type adminFlags struct {
	server, token string
	cell          int64
	// userToken, when registered (registerUserToken), is a user's token
	// to act with instead of the admin token.
	userToken *string
}

// registerUserToken adds --token: a user's token (berth users) for a
// command a project member may run, as what says.
func (a *adminFlags) registerUserToken(cmd *cobra.Command, what string) {
	a.userToken = new(string)
	cmd.Flags().StringVar(a.userToken, "token", "", "your user token (berth users), as "+what+" (default $BERTH_TOKEN; else the admin token)")
}

func (a *adminFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&a.server, "server", "http://127.0.0.1:8080", "coordinator URL")
	cmd.Flags().Int64Var(&a.cell, "cell", 0, "the cell to act on, through a berth router whose cells do not recognise the admin token by itself (docs/cells.md; default $BERTH_CELL, else the token's)")
	cmd.Flags().StringVar(&a.token, "admin-token", "", "admin token (default: $BERTH_ADMIN_TOKEN, else the admin-token file of the default data directory)")
}

func (a *adminFlags) client() (*client.Client, error) {
	// Flags before the environment: --token, --admin-token, then
	// $BERTH_TOKEN (where a user's token is taken), $BERTH_ADMIN_TOKEN.
	tok := a.token
	if a.userToken != nil {
		tok = cmp.Or(*a.userToken, tok, os.Getenv("BERTH_TOKEN"))
	}
	if tok == "" {
		tok = os.Getenv("BERTH_ADMIN_TOKEN")
	}
	if tok == "" {
		if b, err := os.ReadFile(filepath.Join(defaultDataDir(), adminTokenFile)); err == nil {
			tok = strings.TrimSpace(string(b))
		}
	}
	if tok == "" {
		return nil, errors.New("no admin token: pass --admin-token or set BERTH_ADMIN_TOKEN")
	}
	c := client.New(a.server, tok)
	c.Cell = a.cell
	if v := os.Getenv("BERTH_CELL"); c.Cell == 0 && v != "" {
		cell, err := strconv.ParseInt(v, 10, 64)
		if err != nil || cell <= 0 {
			return nil, fmt.Errorf("BERTH_CELL=%q: want a cell id", v)
		}
		c.Cell = cell
	}
	return c, nil
}

func newRunnersCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "runners", Short: "Manage runners on a coordinator (admin)"}
	cmd.AddCommand(newRunnersCreateCmd(), newRunnersListCmd(), newRegistrationTokenCmd())
	return cmd
}

func newRunnersCreateCmd() *cobra.Command {
	var (
		af                          adminFlags
		tags                        string
		runUntagged, locked, paused bool
		project, group              int64
		description, accessLevel    string
		maxTimeout                  int
	)
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Create a runner and print its glrt- authentication token (only the token, on stdout)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			req := restapi.CreateRunnerRequest{
				RunnerType: "instance_type", Description: description, Locked: locked, Paused: paused,
				TagList: runnerapi.SplitTags(tags), AccessLevel: accessLevel, MaximumTimeout: maxTimeout,
			}
			switch {
			case project != 0 && group != 0:
				return errors.New("--project and --group exclude each other")
			case project != 0:
				req.RunnerType, req.ProjectID = "project_type", project
			case group != 0:
				req.RunnerType, req.GroupID = "group_type", group
			}
			if cmd.Flags().Changed("run-untagged") {
				req.RunUntagged = &runUntagged
			}
			resp, err := c.CreateRunner(cmd.Context(), req)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), resp.Token)
			return nil
		},
	}
	af.register(cmd)
	f := cmd.Flags()
	f.StringVar(&tags, "tags", "", "comma-separated tags")
	f.BoolVar(&runUntagged, "run-untagged", false, "also run untagged jobs (default: only when no tags are given)")
	f.BoolVar(&locked, "locked", false, "lock the runner to its project")
	f.BoolVar(&paused, "paused", false, "create the runner paused")
	f.Int64Var(&project, "project", 0, "create a project runner for this project id")
	f.Int64Var(&group, "group", 0, "create a group runner for this group id")
	f.StringVar(&description, "description", "", "description")
	f.StringVar(&accessLevel, "access-level", "not_protected", "not_protected or ref_protected")
	f.IntVar(&maxTimeout, "maximum-timeout", 0, "maximum job timeout in seconds (0: none)")
	return cmd
}

func newRunnersListCmd() *cobra.Command {
	var (
		af     adminFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List runners",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			list, err := c.ListRunners(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(list)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tTYPE\tSTATUS\tTAGS\tUNTAGGED\tDESCRIPTION")
			for _, r := range list {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%v\t%s\n", r.ID, r.RunnerType, r.Status, strings.Join(r.TagList, ","), r.RunUntagged, r.Description)
			}
			return tw.Flush()
		},
	}
	af.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newRegistrationTokenCmd() *cobra.Command {
	var (
		af             adminFlags
		project, group int64
	)
	cmd := &cobra.Command{
		Use:   "registration-token",
		Short: "Mint a legacy registration token (GR1348941…) and print it; the previous one stops working",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			scope, id := "", int64(0)
			switch {
			case project != 0 && group != 0:
				return errors.New("--project and --group exclude each other")
			case project != 0:
				scope, id = "projects", project
			case group != 0:
				scope, id = "groups", group
			}
			tok, err := c.ResetRegistrationToken(cmd.Context(), scope, id)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), tok)
			return nil
		},
	}
	af.register(cmd)
	cmd.Flags().Int64Var(&project, "project", 0, "token registering project runners of this project")
	cmd.Flags().Int64Var(&group, "group", 0, "token registering group runners of this group")
	return cmd
}
