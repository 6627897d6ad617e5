package runner

import (
	"encoding/json"
	"fmt"
	"log/slog"
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

// pollServer is a coordinator without jobs that holds every request
// carrying a last_update (long polling) until the test ends, and counts
// requests.
type pollServer struct {
	*httptest.Server
	mu          sync.Mutex
	asked, held int
	release     chan struct{}
}

func newPollServer(t *testing.T) *pollServer {
	p := &pollServer{release: make(chan struct{})}
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v4/jobs/request" {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		var req runnerapi.JobRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		p.mu.Lock()
		p.asked++
		hold := req.LastUpdate != ""
		if hold {
			p.held++
		}
		p.mu.Unlock()
		if hold {
			select {
			case <-p.release:
			case <-r.Context().Done():
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set(runnerapi.HeaderLastUpdate, "v1")
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(func() { close(p.release); p.Close() })
	return p
}

func (p *pollServer) counts() (asked, held int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.asked, p.held
}

// TestRoomGoesRoundTheEntries: a manager with room for one job and two
// entries (two cells) asks both, neither's request held by its
// coordinator, where long polling would leave the room with one of them.
// With room for both, both are held.
func TestRoomGoesRoundTheEntries(t *testing.T) {
	for _, tt := range []struct {
		concurrent int
		wantHeld   bool
	}{{1, false}, {2, true}} {
		a, b := newPollServer(t), newPollServer(t)
		cfg := &config.Config{Concurrent: tt.concurrent, Runners: []*config.Runner{
			{Name: "a", URL: a.URL, Token: "glrt-a", Executor: "shell"},
			{Name: "b", URL: b.URL, Token: "glrt-b", Executor: "shell"},
		}}
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		m, err := New(cfg, Options{Logger: slog.New(slog.DiscardHandler), PollInterval: 20 * time.Millisecond,
			NewProvider: func(*config.Runner) (executor.Provider, error) { return shell.New(shell.Config{}), nil }})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- m.Run(t.Context()) }()
		waitFor(t, fmt.Sprintf("both entries to ask (concurrent %d)", tt.concurrent), func() bool {
			aa, ah := a.counts()
			ba, bh := b.counts()
			if tt.wantHeld {
				return ah > 0 && bh > 0
			}
			return aa >= 5 && ba >= 5
		})
		_, ah := a.counts()
		_, bh := b.counts()
		if !tt.wantHeld && ah+bh > 0 {
			t.Errorf("concurrent %d: %d and %d requests held: a held request keeps the room from the other entry", tt.concurrent, ah, bh)
		}
		m.Stop()
	}
}
