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
)

func newSchedulesCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "schedules", Short: "Run pipelines on a cron schedule (admin, or a member of the project with --token)",
		Long: `A pipeline schedule runs a pipeline on a ref at every minute a cron expression matches,
in a time zone, with its own variables; jobs see CI_PIPELINE_SOURCE=schedule
(docs/pipelines.md, "Pipeline schedules"). Developers schedule unprotected refs, maintainers
every ref; only a schedule's owner changes it, and a maintainer may take it over.`}
	cmd.AddCommand(newSchedulesListCmd(), newSchedulesShowCmd(), newSchedulesCreateCmd(), newSchedulesUpdateCmd(),
		newSchedulesPlayCmd(), newSchedulesDeleteCmd())
	return cmd
}

// scheduleFlags are the fields create and update take.
type scheduleFlags struct {
	description, ref, cron, timezone string
	active                           bool
	vars                             []string
}

func (f *scheduleFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.description, "description", "", "what the schedule is for")
	cmd.Flags().StringVar(&f.ref, "ref", "", "the branch or tag to run")
	cmd.Flags().StringVar(&f.cron, "cron", "", `when: a 5-field cron expression ("0 2 * * 1-5") or @daily, @hourly, @weekly, @monthly, @yearly`)
	cmd.Flags().StringVar(&f.timezone, "timezone", "UTC", "the cron expression's time zone (an IANA name: Europe/Berlin, America/New_York)")
	cmd.Flags().BoolVar(&f.active, "active", true, "whether it runs (--active=false pauses it)")
	cmd.Flags().StringArrayVar(&f.vars, "var", nil, "KEY=VALUE, a variable of its pipelines (repeat the flag for more)")
}

// request is what was given on the command line (on update, only the
// flags set).
func (f *scheduleFlags) request(cmd *cobra.Command, all bool) client.ScheduleRequest {
	var req client.ScheduleRequest
	set := func(name string, v *string) *string {
		if all || cmd.Flags().Changed(name) {
			return v
		}
		return nil
	}
	req.Description, req.Ref, req.Cron, req.CronTimezone = set("description", &f.description), set("ref", &f.ref), set("cron", &f.cron), set("timezone", &f.timezone)
	if all || cmd.Flags().Changed("active") {
		req.Active = &f.active
	}
	return req
}

func (f *scheduleFlags) variables() ([]restapi.ScheduleVariableJSON, error) {
	var out []restapi.ScheduleVariableJSON
	for _, kv := range f.vars {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--var %q: want KEY=VALUE", kv)
		}
		out = append(out, restapi.ScheduleVariableJSON{Key: k, Value: v, VariableType: "env_var"})
	}
	return out, nil
}

// positiveID reads a schedule's or a trigger's id.
func positiveID(s string) (int64, error) {
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 {
		return 0, fmt.Errorf("id %q: want a positive number", s)
	}
	return id, nil
}

func printSchedule(cmd *cobra.Command, asJSON bool, ps *restapi.PipelineScheduleJSON) error {
	if asJSON {
		return json.NewEncoder(cmd.OutOrStdout()).Encode(ps)
	}
	state := "active"
	if !ps.Active {
		state = "paused"
	}
	fmt.Fprintf(cmd.OutOrStdout(), "schedule %d (%s): %s on %s, %q in %s, next run %s\n", ps.ID, state, ps.Description, ps.Ref, ps.Cron,
		ps.CronTimezone, dashIfNil(ps.NextRunAt))
	return nil
}

func newSchedulesListCmd() *cobra.Command {
	var (
		af     adminFlags
		asJSON bool
		scope  string
	)
	cmd := &cobra.Command{
		Use:   "list PROJECT",
		Short: "List a project's pipeline schedules",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			list, err := c.ListSchedules(cmd.Context(), args[0], scope)
			if err != nil {
				return err
			}
			if asJSON {
				if list == nil {
					list = []restapi.PipelineScheduleJSON{}
				}
				return json.NewEncoder(cmd.OutOrStdout()).Encode(list)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tDESCRIPTION\tREF\tCRON\tZONE\tACTIVE\tNEXT RUN\tOWNER")
			for _, s := range list {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%v\t%s\t%s\n", s.ID, s.Description, s.Ref, s.Cron, s.CronTimezone, s.Active, dashIfNil(s.NextRunAt), s.Owner.Username)
			}
			return tw.Flush()
		},
	}
	af.register(cmd)
	af.registerUserToken(cmd, "a member of the project (reporter or more)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().StringVar(&scope, "scope", "", "only active or inactive schedules")
	return cmd
}

func newSchedulesShowCmd() *cobra.Command {
	var (
		af     adminFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "show PROJECT ID",
		Short: "Show a schedule, its last pipeline and (to its owner and maintainers) its variables",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := positiveID(args[1])
			if err != nil {
				return err
			}
			c, err := af.client()
			if err != nil {
				return err
			}
			ps, err := c.Schedule(cmd.Context(), args[0], id)
			if err != nil {
				return err
			}
			if err := printSchedule(cmd, asJSON, ps); err != nil || asJSON {
				return err
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "owner: %s\n", ps.Owner.Username)
			if lp := ps.LastPipeline; lp != nil {
				fmt.Fprintf(w, "last pipeline: %d (%s, %s)\n", lp.ID, lp.Status, dashIfNil(lp.CreatedAt))
			}
			if ps.Variables != nil {
				for _, v := range *ps.Variables {
					fmt.Fprintf(w, "variable %s (%s)\n", v.Key, v.VariableType) // values are secrets: --json shows them
				}
			}
			return nil
		},
	}
	af.register(cmd)
	af.registerUserToken(cmd, "a member of the project (reporter or more)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON (with variable values)")
	return cmd
}

func newSchedulesCreateCmd() *cobra.Command {
	var (
		af     adminFlags
		f      scheduleFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "create PROJECT --description TEXT --ref REF --cron EXPR [--timezone ZONE] [--var KEY=VALUE]...",
		Short: "Schedule a project's pipelines",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			vars, err := f.variables()
			if err != nil {
				return err
			}
			c, err := af.client()
			if err != nil {
				return err
			}
			ps, err := c.CreateSchedule(cmd.Context(), args[0], f.request(cmd, true))
			if err != nil {
				return err
			}
			for _, v := range vars {
				if err := c.SetScheduleVariable(cmd.Context(), args[0], ps.ID, v); err != nil {
					return fmt.Errorf("schedule %d created; variable %s: %w", ps.ID, v.Key, err)
				}
			}
			return printSchedule(cmd, asJSON, ps)
		},
	}
	af.register(cmd)
	af.registerUserToken(cmd, "a developer of the project (a maintainer for its default branch)")
	f.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	for _, name := range []string{"description", "ref", "cron"} {
		_ = cmd.MarkFlagRequired(name)
	}
	return cmd
}

func newSchedulesUpdateCmd() *cobra.Command {
	var (
		af     adminFlags
		f      scheduleFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "update PROJECT ID [--cron EXPR] [--active=false] [--var KEY=VALUE]...",
		Short: "Change a schedule: the flags given, and the variables named (only its owner may)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := positiveID(args[1])
			if err != nil {
				return err
			}
			vars, err := f.variables()
			if err != nil {
				return err
			}
			c, err := af.client()
			if err != nil {
				return err
			}
			ps, err := c.UpdateSchedule(cmd.Context(), args[0], id, f.request(cmd, false))
			if err != nil {
				return err
			}
			for _, v := range vars {
				if err := c.SetScheduleVariable(cmd.Context(), args[0], id, v); err != nil {
					return fmt.Errorf("variable %s: %w", v.Key, err)
				}
			}
			return printSchedule(cmd, asJSON, ps)
		},
	}
	af.register(cmd)
	af.registerUserToken(cmd, "the schedule's owner")
	f.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newSchedulesPlayCmd() *cobra.Command {
	return projectIDCmd("play PROJECT ID", "Run a schedule's pipeline now (its next run stays where it is)",
		"a developer of the project (a maintainer for its default branch)",
		func(cmd *cobra.Command, c *client.Client, project string, id int64) error {
			if err := c.PlaySchedule(cmd.Context(), project, id); err != nil {
				return err
			}
			ps, err := c.Schedule(cmd.Context(), project, id)
			if err != nil {
				return err
			}
			if ps.LastPipeline != nil {
				fmt.Fprintf(cmd.OutOrStdout(), "pipeline %d\n", ps.LastPipeline.ID)
			}
			return nil
		})
}

func newSchedulesDeleteCmd() *cobra.Command {
	return projectIDCmd("delete PROJECT ID", "Delete a schedule (its pipelines stay)", "the schedule's owner or a maintainer",
		func(cmd *cobra.Command, c *client.Client, project string, id int64) error {
			return c.DeleteSchedule(cmd.Context(), project, id)
		})
}

// projectIDCmd is a command of PROJECT ID with no flags of its own that
// acts through the client with run (schedules play and delete, triggers
// delete); who says whose --token it takes.
func projectIDCmd(use, short, who string, run func(cmd *cobra.Command, c *client.Client, project string, id int64) error) *cobra.Command {
	var af adminFlags
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := positiveID(args[1])
			if err != nil {
				return err
			}
			c, err := af.client()
			if err != nil {
				return err
			}
			return run(cmd, c, args[0], id)
		},
	}
	af.register(cmd)
	af.registerUserToken(cmd, who)
	return cmd
}
