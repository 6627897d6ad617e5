package runner

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/executor/shell"
	"github.com/berthci/berth/runner/config"
	"github.com/berthci/berth/runnerapi"
)

// fleetProvider is a shell provider that reports a fleet.
type fleetProvider struct {
	executor.Provider
}

func (fleetProvider) Fleet() runnerapi.Fleet {
	return runnerapi.Fleet{Ready: 2, Capacity: 3, SlotsInUse: 1, Boots: 4, InstanceSeconds: 90}
}

// A manager whose executor autoscales reports its fleet, with its system
// id and executor, at once and every fleetInterval; against a coordinator
// without the endpoint (GitLab: 404) it stops after the first try.
func TestFleetReports(t *testing.T) {
	for _, tc := range []struct {
		name  string
		code  int
		wantN int // reports expected (at least)
	}{{"berth", http.StatusNoContent, 1}, {"gitlab", http.StatusNotFound, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			var (
				mu      sync.Mutex
				reports []runnerapi.Fleet
				tokens  []string
			)
			mux := http.NewServeMux()
			mux.HandleFunc("PUT /api/v4/berth/runners/fleet", func(w http.ResponseWriter, r *http.Request) {
				var f runnerapi.Fleet
				_ = json.NewDecoder(r.Body).Decode(&f)
				mu.Lock()
				reports = append(reports, f)
				tokens = append(tokens, r.Header.Get(runnerapi.HeaderRunnerToken))
				mu.Unlock()
				w.WriteHeader(tc.code)
			})
			mux.HandleFunc("POST /api/v4/jobs/request", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
			srv := httptest.NewServer(mux)
			defer srv.Close()
			h := newHarness(t, newFake(t), func(c *config.Config, o *Options) {
				c.Runners[0].URL = srv.URL
				o.NewProvider = func(*config.Runner) (executor.Provider, error) {
					return fleetProvider{shell.New(shell.Config{Helper: helperBinary(t)})}, nil
				}
			})
			h.start()
			waitFor(t, "a fleet report", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(reports) >= tc.wantN
			})
			time.Sleep(100 * time.Millisecond)
			h.stop()
			_ = h.wait()
			mu.Lock()
			defer mu.Unlock()
			f := reports[0]
			if f.SystemID != testSystemID || f.Executor != "shell" || f.Ready != 2 || f.Boots != 4 || tokens[0] != "glrt-t1_runnertoken" {
				t.Errorf("report %+v, token %q", f, tokens[0])
			}
			switch tc.code {
			case http.StatusNotFound:
				if len(reports) != 1 {
					t.Errorf("%d reports to a coordinator without the endpoint, want 1", len(reports))
				}
			default:
				// The last word as the manager stops.
				if len(reports) < 2 {
					t.Errorf("%d reports, want one more as the manager stopped", len(reports))
				}
			}
		})
	}
}
