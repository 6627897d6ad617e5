package main

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/berthci/berth/coordinator/embedded"
	"github.com/berthci/berth/coordinator/jobtoken"
	"github.com/berthci/berth/coordinator/store"
)

// newJobTokenKeysCmd is berth server job-token-keys: the keys that sign
// the jobs' job tokens (docs/cells.md, "Job tokens").
func newJobTokenKeysCmd() *cobra.Command {
	var data, storeURL string
	cmd := &cobra.Command{
		Use:   "job-token-keys",
		Short: "List, rotate and remove the keys that sign job tokens",
		Long: `Job tokens (CI_JOB_TOKEN and the runner's token for a job) are JWTs the
coordinator signs with the newest key kept in its store; every key there
verifies. Replicas sharing the store share the keys: they verify a new key's
tokens at once and sign with it within 10 seconds.

Rotation without downtime: rotate (the new key signs from now on), wait until
the tokens the old key signed have expired (a token lives as long as its job
can run: the ack timeout, the job's timeout and 5 minutes), then remove the
old key.`,
		Args: cobra.NoArgs,
	}
	cmd.PersistentFlags().StringVar(&data, "data", defaultDataDir(), "data directory of the coordinator")
	cmd.PersistentFlags().StringVar(&storeURL, "store", "", "the coordinator's --store (default: $BERTH_STORE, else sqlite)")
	withStore := func(cmd *cobra.Command, fn func(st store.Store) error) error {
		if storeURL == "" {
			storeURL = os.Getenv("BERTH_STORE")
		}
		st, err := embedded.OpenStore(cmd.Context(), data, storeURL)
		if err != nil {
			return err
		}
		defer st.Close()
		return fn(st)
	}
	list := &cobra.Command{
		Use:   "list",
		Short: "List the keys, oldest first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withStore(cmd, func(st store.Store) error {
				infos, err := jobtoken.List(cmd.Context(), st)
				if err != nil {
					return err
				}
				for _, in := range infos {
					role := "verifies"
					if in.Signing {
						role = "signs"
					}
					fmt.Fprintf(cmd.OutOrStdout(), "%s\t%s\t%s\n", in.KID, in.Created.Format(time.RFC3339), role)
				}
				return nil
			})
		},
	}
	rotate := &cobra.Command{
		Use:   "rotate",
		Short: "Add a key that signs from now on; older keys keep verifying",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withStore(cmd, func(st store.Store) error {
				in, err := jobtoken.Rotate(cmd.Context(), st)
				if err == nil {
					fmt.Fprintln(cmd.OutOrStdout(), in.KID)
				}
				return err
			})
		},
	}
	remove := &cobra.Command{
		Use:   "remove [--] KID",
		Short: "Remove a key that no longer signs: tokens it signed stop verifying",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withStore(cmd, func(st store.Store) error { return jobtoken.Remove(cmd.Context(), st, args[0]) })
		},
	}
	keyIDAfterDashes(remove)
	cmd.AddCommand(list, rotate, remove)
	return cmd
}

// keyIDAfterDashes makes a remove command whose key id was read as a flag
// say how to pass it: key ids are base64url, and one made before keys
// whose id begins with '-' were made again may begin with it; it goes
// after --.
func keyIDAfterDashes(cmd *cobra.Command) {
	cmd.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return fmt.Errorf("%w (a key id that begins with '-' goes after --: %s [flags] -- KID)", err, c.CommandPath())
	})
}
