package slotcgroup

import (
	"fmt"
	"os"
	"testing"
)

// roleEnv makes the test binary play a helper process instead of running
// tests: "hog" allocates and touches hogBytes of memory, then prints
// "survived".
const roleEnv = "BERTH_SLOTCGROUP_TEST_ROLE"

const hogBytes = 200 << 20

// sink keeps the hog's memory reachable.
var sink []byte

func TestMain(m *testing.M) {
	if os.Getenv(roleEnv) == "hog" {
		sink = make([]byte, hogBytes)
		for i := 0; i < len(sink); i += 4096 {
			sink[i] = 1
		}
		fmt.Println("survived")
		os.Exit(0)
	}
	os.Exit(m.Run())
}
