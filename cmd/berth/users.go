package main

import (
	"encoding/json"
	"fmt"
	"strconv"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/berthci/berth/coordinator/restapi"
)

func newUsersCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "users", Short: "Manage the web UI's users on a coordinator (admin)",
		Long: `Manage who may sign in to the web UI. Each user signs in with a token of their own;
an admin may act (cancel, retry, play), a read-only user may only look. The admin token
signs in as admin too. Only the tokens' digests are stored (docs/ui.md).`}
	cmd.AddCommand(newUsersCreateCmd(), newUsersListCmd(), newUsersDeleteCmd())
	return cmd
}

func newUsersCreateCmd() *cobra.Command {
	var (
		af   adminFlags
		role string
	)
	cmd := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a user and print their sign-in token (only the token, on stdout; shown this once)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			u, err := c.CreateUser(cmd.Context(), restapi.CreateUserRequest{Name: args[0], Role: role})
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), u.Token)
			return nil
		},
	}
	af.register(cmd)
	cmd.Flags().StringVar(&role, "role", "read-only", "admin (may act) or read-only (may only look)")
	return cmd
}

func newUsersListCmd() *cobra.Command {
	var (
		af     adminFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List users",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			list, err := c.ListUsers(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(list)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tROLE\tCREATED")
			for _, u := range list {
				created := ""
				if u.CreatedAt != nil {
					created = *u.CreatedAt
				}
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", u.ID, u.Name, u.Role, created)
			}
			return tw.Flush()
		},
	}
	af.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newUsersDeleteCmd() *cobra.Command {
	var af adminFlags
	cmd := &cobra.Command{
		Use:   "delete ID",
		Short: "Delete a user; their sessions end at once",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := strconv.ParseInt(args[0], 10, 64)
			if err != nil || id <= 0 {
				return fmt.Errorf("user id %q: want a number (berth users list)", args[0])
			}
			c, err := af.client()
			if err != nil {
				return err
			}
			return c.DeleteUser(cmd.Context(), id)
		},
	}
	af.register(cmd)
	return cmd
}
