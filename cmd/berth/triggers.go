package main

import (
	"encoding/json"
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/berthci/berth/coordinator/client"
	"github.com/berthci/berth/coordinator/restapi"
)

func newTriggersCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "triggers", Short: "Manage a project's pipeline trigger tokens (admin, or a maintainer of the project with --token)",
		Long: `A trigger token creates the project's pipelines without a user's token, with its owner's access:

  curl --request POST --form token=TOKEN --form ref=main --form "variables[DEPLOY]=yes" \
    SERVER/api/v4/projects/PROJECT_ID/trigger/pipeline

Jobs see CI_PIPELINE_SOURCE=trigger and TRIGGER_PAYLOAD (docs/pipelines.md, "Pipeline triggers").
A job's CI_JOB_TOKEN works in place of a trigger token (source pipeline).`}
	cmd.AddCommand(newTriggersCreateCmd(), newTriggersListCmd(), newTriggersDeleteCmd())
	return cmd
}

func newTriggersCreateCmd() *cobra.Command {
	var (
		af                     adminFlags
		description, expiresAt string
		asJSON                 bool
	)
	cmd := &cobra.Command{
		Use:   "create PROJECT --description TEXT [--expires-at DATE]",
		Short: "Create a trigger token and print it (shown this once: Berth keeps its digest)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			t, err := c.CreateTrigger(cmd.Context(), args[0], description, expiresAt)
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(t)
			}
			fmt.Fprintln(cmd.OutOrStdout(), t.Token)
			return nil
		},
	}
	af.register(cmd)
	af.registerUserToken(cmd, "a maintainer of the project (the token's owner)")
	cmd.Flags().StringVar(&description, "description", "", "what the token is for")
	cmd.Flags().StringVar(&expiresAt, "expires-at", "", "when it stops working: a date (2027-06-30) or an RFC 3339 time (default: never)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON (with the token)")
	_ = cmd.MarkFlagRequired("description")
	return cmd
}

func newTriggersListCmd() *cobra.Command {
	var (
		af     adminFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "list PROJECT",
		Short: "List a project's trigger tokens (their first characters)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			list, err := c.ListTriggers(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if asJSON {
				if list == nil {
					list = []restapi.PipelineTriggerJSON{}
				}
				return json.NewEncoder(cmd.OutOrStdout()).Encode(list)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tTOKEN\tDESCRIPTION\tOWNER\tLAST USED\tEXPIRES")
			for _, t := range list {
				fmt.Fprintf(tw, "%d\t%s…\t%s\t%s\t%s\t%s\n", t.ID, t.Token, t.Description, t.Owner.Username, dashIfNil(t.LastUsed), dashIfNil(t.ExpiresAt))
			}
			return tw.Flush()
		},
	}
	af.register(cmd)
	af.registerUserToken(cmd, "a maintainer of the project")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newTriggersDeleteCmd() *cobra.Command {
	return projectIDCmd("delete PROJECT ID", "Delete a trigger token: it creates no more pipelines", "a maintainer of the project",
		func(cmd *cobra.Command, c *client.Client, project string, id int64) error {
			return c.DeleteTrigger(cmd.Context(), project, id)
		})
}
