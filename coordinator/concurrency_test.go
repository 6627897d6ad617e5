package coordinator

import (
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/runnerapi"
)

// Many runner managers long-poll over real HTTP while jobs with different
// tags are enqueued concurrently: every job is handed out exactly once, and
// only to a runner allowed to run it.
func TestConcurrentDispatchExactlyOnce(t *testing.T) {
	e := newEnv(t, Config{LongPollTimeout: 200 * time.Millisecond})
	type runnerDef struct {
		tok  string
		tags map[string]bool
		any  bool
	}
	defs := []runnerDef{}
	for _, tags := range [][]string{{"linux"}, {"linux", "docker"}, {"gpu"}, nil} {
		tm := map[string]bool{}
		for _, tg := range tags {
			tm[tg] = true
		}
		tok := e.createRunner(restapi.CreateRunnerRequest{TagList: tags, RunUntagged: boolPtr(len(tags) == 0 || tm["linux"])})
		defs = append(defs, runnerDef{tok: tok, tags: tm, any: len(tags) == 0 || tm["linux"]})
	}
	jobTags := [][]string{nil, {"linux"}, {"docker", "linux"}, {"gpu"}}
	const jobs = 400
	tagsOf := map[int64][]string{}
	var mu sync.Mutex
	got := map[int64]int{}
	var handed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < 24; i++ {
		d := defs[i%len(defs)]
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			last := ""
			for {
				select {
				case <-stop:
					return
				default:
				}
				r, job := e.request(d.tok, fmt.Sprintf("s_%d", i), last)
				last = r.header.Get(runnerapi.HeaderLastUpdate)
				if r.code == http.StatusConflict || r.code == http.StatusNoContent {
					continue
				}
				if job == nil {
					t.Errorf("request: %d %s", r.code, r.body)
					return
				}
				mu.Lock()
				got[job.ID]++
				tags := tagsOf[job.ID]
				mu.Unlock()
				for _, tg := range tags {
					if !d.tags[tg] {
						t.Errorf("runner with tags %v got job %d with tags %v", d.tags, job.ID, tags)
					}
				}
				if len(tags) == 0 && !d.any {
					t.Errorf("runner with tags %v (no run_untagged) got untagged job %d", d.tags, job.ID)
				}
				e.update(job, runnerapi.UpdateJobRequest{State: "running"})
				handed.Add(1)
			}
		}(i)
	}
	var ew sync.WaitGroup
	for p := 0; p < 4; p++ {
		ew.Add(1)
		go func(p int) {
			defer ew.Done()
			for i := p; i < jobs; i += 4 {
				spec := simpleSpec(fmt.Sprintf("j%d", i))
				spec.Tags = jobTags[i%len(jobTags)]
				mu.Lock() // record tags before anyone can receive the job
				id := e.enqueue(spec)
				tagsOf[id] = spec.Tags
				mu.Unlock()
			}
		}(p)
	}
	ew.Wait()
	waitFor(t, "every job handed out", func() bool { return handed.Load() >= jobs })
	close(stop)
	wg.Wait()
	if len(got) != jobs {
		t.Fatalf("%d distinct jobs handed out, want %d", len(got), jobs)
	}
	for id, n := range got {
		if n != 1 {
			t.Errorf("job %d handed out %d times", id, n)
		}
	}
}

func boolPtr(b bool) *bool { return &b }
