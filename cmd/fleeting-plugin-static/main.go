// Command fleeting-plugin-static is the fleeting plugin over a fixed list of
// existing SSH hosts (fleeting/plugins/static).
package main

import (
	"github.com/berthci/berth/fleeting/plugins/static"
	"github.com/berthci/berth/fleeting/sdk"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	sdk.Serve(&static.Group{}, sdk.Options{Name: "fleeting-plugin-static", Version: version})
}
