// Command fleeting-plugin-fake is the fleeting plugin of a simulated cloud
// (fleeting/plugins/fake): configurable boot latency, failure injection and
// quota, for tests and demos. It runs on the real clock.
package main

import (
	"github.com/berthci/berth/fleeting/plugins/fake"
	"github.com/berthci/berth/fleeting/sdk"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	sdk.Serve(fake.New(fake.Config{}, nil), sdk.Options{Name: "fleeting-plugin-fake", Version: version})
}
