package main

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/berthci/berth/coordinator/client"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/coordinator/store"
)

// accessLevels names GitLab's member access levels.
var accessLevels = []struct {
	name  string
	level store.MemberAccess
}{
	{"guest", store.AccessGuest}, {"reporter", store.AccessReporter}, {"developer", store.AccessDeveloper},
	{"maintainer", store.AccessMaintainer}, {"owner", store.AccessOwner},
}

// parseAccess reads an access level by name or number.
func parseAccess(s string) (int, error) {
	for _, a := range accessLevels {
		if strings.EqualFold(s, a.name) || s == strconv.Itoa(int(a.level)) {
			return int(a.level), nil
		}
	}
	return 0, fmt.Errorf("access level %q: want guest, reporter, developer, maintainer or owner (or 10 to 50)", s)
}

func accessName(level int) string {
	for _, a := range accessLevels {
		if int(a.level) == level {
			return a.name
		}
	}
	return strconv.Itoa(level)
}

func newMembersCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "members", Short: "Manage who is a member of a project, and at which level (admin, or a maintainer of the project with --token)",
		Long: `A project's members are users (berth users) with an access level in it, GitLab's:
guest, reporter, developer, maintainer, owner. Maintainers and owners are the project's
admins: they may list and fetch its failed jobs' VM snapshots (berth debug), erase its jobs and
delete their artifacts. Instance admins may do so in every project (docs/snapshots.md).

Members are managed by instance admins and, with their own --token, by the project's
maintainers (up to the maintainer level, never an owner) and owners (everything but leaving
the project without an owner); any member may remove themself (leave).`}
	cmd.AddCommand(newMembersAddCmd(), newMembersListCmd(), newMembersRemoveCmd())
	return cmd
}

func newMembersAddCmd() *cobra.Command {
	var (
		af     adminFlags
		access string
	)
	cmd := &cobra.Command{
		Use:   "add PROJECT USER",
		Short: "Make a user (name or id) a member of a project (id or path), or change their level",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			level, err := parseAccess(access)
			if err != nil {
				return err
			}
			c, err := af.client()
			if err != nil {
				return err
			}
			req := restapi.MemberRequest{AccessLevel: level}
			if id, err := strconv.ParseInt(args[1], 10, 64); err == nil {
				req.UserID = json.Number(strconv.FormatInt(id, 10))
			} else {
				req.Username = args[1]
			}
			m, err := c.AddProjectMember(cmd.Context(), args[0], req)
			if client.IsConflict(err) {
				var uid int64
				if uid, err = memberID(cmd, c, args[0], args[1]); err == nil {
					m, err = c.UpdateProjectMember(cmd.Context(), args[0], uid, level)
				}
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s is %s of %s\n", m.Username, accessName(m.AccessLevel), args[0])
			return nil
		},
	}
	af.register(cmd)
	af.registerUserToken(cmd, "a maintainer or owner of the project")
	cmd.Flags().StringVar(&access, "access", "developer", "guest, reporter, developer, maintainer or owner (maintainers and owners are the project's admins)")
	return cmd
}

func newMembersListCmd() *cobra.Command {
	var (
		af     adminFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "list PROJECT",
		Short: "List a project's members",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			list, err := c.ProjectMembers(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(list)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tUSER\tACCESS")
			for _, m := range list {
				fmt.Fprintf(tw, "%d\t%s\t%s\n", m.ID, m.Username, accessName(m.AccessLevel))
			}
			return tw.Flush()
		},
	}
	af.register(cmd)
	af.registerUserToken(cmd, "a maintainer or owner of the project")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newMembersRemoveCmd() *cobra.Command {
	var af adminFlags
	cmd := &cobra.Command{
		Use:   "remove PROJECT USER",
		Short: "Remove a user (name or id) from a project; your own name leaves it",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			uid, err := memberID(cmd, c, args[0], args[1])
			if err != nil {
				return err
			}
			return c.RemoveProjectMember(cmd.Context(), args[0], uid)
		},
	}
	af.register(cmd)
	af.registerUserToken(cmd, "a maintainer or owner of the project, or the member leaving")
	return cmd
}

// memberID is the id of user (an id, or a member's name) in project: the
// token's own user needs no list (a member leaving may not read it).
func memberID(cmd *cobra.Command, c *client.Client, project, user string) (int64, error) {
	if id, err := strconv.ParseInt(user, 10, 64); err == nil {
		return id, nil
	}
	if me, err := c.CurrentUser(cmd.Context()); err == nil && me.ID != 0 && me.Username == user {
		return me.ID, nil
	}
	list, err := c.ProjectMembers(cmd.Context(), project)
	if err != nil {
		return 0, err
	}
	for _, m := range list {
		if m.Username == user {
			return m.ID, nil
		}
	}
	return 0, fmt.Errorf("%s is not a member of %s (berth members list %s)", user, project, project)
}
