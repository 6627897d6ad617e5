package host_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berthci/berth/fleeting/host"
	"github.com/berthci/berth/fleeting/internal/wiretest"
)

// The test binary plays other processes, chosen by BERTH_TEST_ROLE:
// "rawplugin" is a plugin written from the protocol description only;
// "host" is a host that starts BERTH_TEST_PLUGIN, prints its pid and waits
// to be killed.
func TestMain(m *testing.M) {
	switch os.Getenv("BERTH_TEST_ROLE") {
	case "rawplugin":
		wiretest.ServeRawPlugin()
	case "host":
		helperHost()
	}
	os.Exit(m.Run())
}

func helperHost() {
	cfg := host.Config{Plugin: os.Getenv("BERTH_TEST_PLUGIN"), PluginConfig: []byte(`{}`)}
	if os.Getenv("BERTH_TEST_NODEATHSIG") == "1" {
		host.WithoutDeathSignal(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := host.Start(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper host:", err)
		os.Exit(1)
	}
	fmt.Println(p.Pid())
	time.Sleep(10 * time.Minute)
	os.Exit(2)
}

// alive reports whether process pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return false
	}
	return s[i+2] != 'Z'
}

// waitGone waits (bounded generously) for process pid to end.
func waitGone(t *testing.T, pid int, what string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("%s (pid %d) is still running", what, pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
