// Command fleeting-plugin-local is the fleeting plugin whose instances are
// SSH servers of Berth's own on this machine (fleeting/plugins/local). The
// same binary runs those servers: `fleeting-plugin-local instance-server DIR`.
package main

import (
	"context"

	"github.com/berthci/berth/fleeting/plugins/local"
	"github.com/berthci/berth/fleeting/sdk"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	sdk.Serve(&local.Group{}, sdk.Options{
		Name:    "fleeting-plugin-local",
		Version: version,
		Commands: map[string]func(context.Context, []string) error{
			local.ServerCommand: local.RunServer,
		},
	})
}
