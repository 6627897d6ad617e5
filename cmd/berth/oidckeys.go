package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/berthci/berth/coordinator/embedded"
	"github.com/berthci/berth/coordinator/idtoken"
)

// newOIDCKeysCmd is berth server oidc-keys: the keys that sign jobs' ID
// tokens (docs/ci-yaml.md, "ID tokens and secrets").
func newOIDCKeysCmd() *cobra.Command {
	var data string
	cmd := &cobra.Command{
		Use:   "oidc-keys",
		Short: "List, rotate and remove the keys that sign jobs' ID tokens",
		Long: `The coordinator signs jobs' ID tokens (id_tokens) with the newest key in
DATA/oidc-keys and publishes every key there at /oauth/discovery/keys.
A running coordinator notices a rotation or a removal within a second.

Rotation without downtime: rotate (the new key signs from now on, the old
one stays published), wait until the tokens the old key signed have expired
(a token lives as long as its job's timeout), then remove the old key.`,
		Args: cobra.NoArgs,
	}
	cmd.PersistentFlags().StringVar(&data, "data", defaultDataDir(), "data directory of the coordinator")
	list := &cobra.Command{
		Use:   "list",
		Short: "List the keys, oldest first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			infos, err := idtoken.List(embedded.IDTokenKeyDir(data))
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			for _, in := range infos {
				role := "verifies"
				if in.Signing {
					role = "signs"
				}
				fmt.Fprintf(out, "%s\t%s\t%s\n", in.KID, in.Created.Format(time.RFC3339), role)
			}
			return nil
		},
	}
	rotate := &cobra.Command{
		Use:   "rotate",
		Short: "Add a key that signs from now on; older keys keep verifying",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			in, err := idtoken.Rotate(embedded.IDTokenKeyDir(data))
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s\n", in.KID)
			return nil
		},
	}
	remove := &cobra.Command{
		Use:   "remove [--] KID",
		Short: "Remove a key that no longer signs: tokens it signed stop verifying",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return idtoken.Remove(embedded.IDTokenKeyDir(data), args[0])
		},
	}
	keyIDAfterDashes(remove)
	cmd.AddCommand(list, rotate, remove)
	return cmd
}
