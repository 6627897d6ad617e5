package main

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/berthci/berth/bench"
	"github.com/berthci/berth/internal/testenv"
)

// berth bench run times real berth runs of the generated pipeline beside
// another command and reads their overheads.
func TestBenchRun(t *testing.T) {
	testenv.LookPath(t, "git")
	cmd := berthCmd(t, append(os.Environ(), "XDG_CACHE_HOME="+t.TempDir()),
		"bench", "run", "--jobs", "4", "--runs", "2", "--trivial-jobs", "3", "--against", "true", "--json")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var res bench.RunResult
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if res.Jobs != 4 || res.Runs != 2 || len(res.Berth.Seconds) != 2 || res.Berth.Best <= 0 || res.Berth.Best > res.Berth.Median {
		t.Errorf("berth timings %+v", res)
	}
	if res.Against == nil || res.Against.Command != "true" || len(res.Against.Seconds) != 2 || res.Ratio <= 0 {
		t.Errorf("against %+v ratio %v", res.Against, res.Ratio)
	}
	if res.Overhead.N != 4 || res.Overhead.Median <= 0 || res.Trivial == nil || res.Trivial.N != 3 {
		t.Errorf("overheads %+v trivial %+v", res.Overhead, res.Trivial)
	}
}

func TestFanPipeline(t *testing.T) {
	y := bench.FanPipeline(5)
	for _, want := range []string{"build3:", "test2:", "needs: [build2]", "paths: [out/b3.txt]"} {
		if !strings.Contains(y, want) {
			t.Errorf("pipeline lacks %q:\n%s", want, y)
		}
	}
	if strings.Contains(y, "build4:") || strings.Contains(y, "test3:") {
		t.Errorf("5 jobs are 3 builds and 2 tests:\n%s", y)
	}
}
