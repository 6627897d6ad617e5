// Package bench holds Berth's end-to-end benchmarks that print figures
// (berth bench …). They run real components on loopback; nothing here is a
// test assertion.
package bench

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berthci/berth/coordinator"
	"github.com/berthci/berth/coordinator/client"
	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/coordinator/embedded"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/internal/pgurl"
	"github.com/berthci/berth/jobpush"
	"github.com/berthci/berth/router"
	"github.com/berthci/berth/runnerapi"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx", for the bench's scratch schema
)

// DispatchOptions configure Dispatch.
type DispatchOptions struct {
	Runners     int // long-polling runner managers
	Jobs        int // jobs for the throughput phase
	LatencyJobs int // jobs enqueued one at a time for the latency phase
	Enqueuers   int // goroutines enqueueing in the throughput phase
	// Store is "" (SQLite in a temporary directory) or a postgres:// URL
	// of a database the bench makes a schema of its own in (and drops).
	Store string
	// Replicas is how many coordinators share the store (PostgreSQL
	// only; default 1). Runner i long-polls replica i mod Replicas; the
	// throughput phase enqueues on every replica, the latency phase on
	// the first, every other job of it one that only the other replicas'
	// runners may run (farTag), so those pickups cross replicas.
	Replicas int
	// Cells, when above 1, runs that many cells (each a coordinator with
	// its own SQLite store and cell id) behind a berth router: every
	// runner talks to the router's URL, runner i belongs to cell i mod
	// Cells, and jobs are enqueued on every cell (docs/cells.md).
	Cells int
	// Push makes the runners take their jobs over the job push channel
	// (jobpush: one stream each, with room for one job, announced again
	// after each acknowledgement) instead of long-polling jobs/request.
	Push bool
	// PushRESTAck makes push runners acknowledge their jobs on REST (PUT
	// /jobs/:id), as before streams acknowledged admits, instead of by
	// the admit itself.
	PushRESTAck bool
	// Capacity is how many jobs each runner manager runs at once
	// (default 1): a push stream announces that room; a long-polling
	// manager takes a job, hands it to a worker and asks again at once,
	// holding RequestConcurrency polls (default 1, GitLab's default).
	Capacity           int
	RequestConcurrency int
	// Burst is how many jobs the latency phase enqueues at a time
	// (default 1: one, then the next once it was picked up).
	Burst int
	// RTT puts a network between the runners and the coordinators: every
	// connection of the runners (polls, acknowledgements, push streams)
	// crosses a delay line of RTT/2 each way (delayConn). 0: loopback.
	RTT time.Duration
	// Progress, if set, receives a line now and then.
	Progress io.Writer
	// CPUProfile, if set, receives a CPU profile of the bench's process
	// during the throughput phase (pprof format).
	CPUProfile io.Writer
	// AllocProfile, if set, receives the process's allocation profile
	// (pprof "allocs") at the end of the throughput phase.
	AllocProfile io.Writer
}

// Channels by which the bench's runners get jobs (DispatchResult.Channel).
const (
	ChannelLongPoll = "long_poll"
	ChannelPush     = "push"
)

// DispatchResult are the figures of one Dispatch run.
type DispatchResult struct {
	// Channel is how the runners got jobs: long_poll or push.
	Channel       string  `json:"channel"`
	Runners       int     `json:"runners"`
	Jobs          int     `json:"jobs"`
	CPUs          int     `json:"cpus"`
	Seconds       float64 `json:"seconds"`
	JobsPerSecond float64 `json:"jobs_per_second"`
	// CPUMsPerJob is the CPU time the whole process (coordinators and
	// runners alike) spent per job in the throughput phase: steadier than
	// jobs/s on a machine shared with other work.
	CPUMsPerJob float64 `json:"cpu_ms_per_job,omitempty"`
	LatencyJobs int     `json:"latency_jobs"`
	PickupP50Ms float64 `json:"pickup_p50_ms"`
	PickupP99Ms float64 `json:"pickup_p99_ms"`
	PickupMaxMs float64 `json:"pickup_max_ms"`
	Store       string  `json:"store"`
	Replicas    int     `json:"replicas"`
	Cells       int     `json:"cells,omitempty"`
	// Capacity is each runner manager's room; RequestConcurrency its
	// long polls held at once (long polling); Burst the latency phase's
	// jobs enqueued at a time.
	Capacity           int     `json:"capacity"`
	RequestConcurrency int     `json:"request_concurrency,omitempty"`
	Burst              int     `json:"burst"`
	RTTMs              float64 `json:"rtt_ms,omitempty"`
	// Pickups by a runner held on another replica than the one the job
	// was enqueued on (replicas > 1).
	CrossPickups     int     `json:"cross_replica_pickups,omitempty"`
	CrossPickupP50Ms float64 `json:"cross_replica_pickup_p50_ms,omitempty"`
	CrossPickupP99Ms float64 `json:"cross_replica_pickup_p99_ms,omitempty"`
}

// Dispatch starts an in-process coordinator with SQLite in a temporary
// directory, serves it on loopback, and drives it with Runners clients
// that long-poll over real HTTP (or, with Push, hold a push stream) and
// acknowledge every job they get (two-phase commit: POST /jobs/request
// or a pushed job, then PUT state=running).
//
// Throughput phase: with every client held, Jobs jobs are enqueued by
// Enqueuers goroutines; jobs/s = Jobs ÷ time until the last one is
// acknowledged.
//
// Latency phase: with every client held again, LatencyJobs jobs are
// enqueued one at a time; pickup latency is from the start of the enqueue
// call (which stores the job durably) to the moment a client has read the
// job payload and its acknowledgement was answered.
//
// The coordinators and the runners spread over them are kept apart
// (runner i uses coordinator i mod their number), so that cells can be
// added beside replicas.
func Dispatch(ctx context.Context, o DispatchOptions) (*DispatchResult, error) {
	if o.Runners <= 0 || o.Jobs <= 0 {
		return nil, fmt.Errorf("runners and jobs must be positive")
	}
	if o.Enqueuers <= 0 {
		o.Enqueuers = 4
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if o.Replicas <= 0 {
		o.Replicas = 1
	}
	o.Capacity, o.RequestConcurrency, o.Burst = max(o.Capacity, 1), max(o.RequestConcurrency, 1), max(o.Burst, 1)
	if o.LatencyJobs > 0 && o.LatencyJobs < o.Burst {
		return nil, fmt.Errorf("latency jobs (%d) fewer than a burst (%d)", o.LatencyJobs, o.Burst)
	}
	storeName := "sqlite"
	if o.Store != "" {
		if !embedded.IsPostgres(o.Store) {
			return nil, fmt.Errorf("--store %q: want a postgres:// URL (or nothing for SQLite)", o.Store)
		}
		storeName = "postgres"
		dsn, drop, err := scratchSchema(ctx, o.Store)
		if err != nil {
			return nil, err
		}
		defer drop()
		o.Store = dsn
	} else if o.Replicas > 1 {
		return nil, fmt.Errorf("replicas share a PostgreSQL store: give --store postgres://")
	}
	if o.Cells > 1 && (o.Replicas > 1 || o.Store != "") {
		return nil, fmt.Errorf("cells are coordinators with SQLite stores of their own: no --store or --replicas with --cells")
	}
	dir, err := os.MkdirTemp("", "berth-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	var srvs []*embedded.Coordinator
	defer func() {
		for _, srv := range srvs {
			srv.Shutdown(context.Background())
		}
	}()
	// With cells, every URL the coordinators hand out is the router's.
	var routerLn net.Listener
	external := ""
	if o.Cells > 1 {
		if routerLn, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			return nil, err
		}
		defer routerLn.Close()
		external = "http://" + routerLn.Addr().String()
	}
	var addrs []string // each coordinator's own address
	for r := range max(o.Replicas, o.Cells) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		addrs = append(addrs, "http://"+ln.Addr().String())
		cfg := coordinator.Config{LongPollTimeout: 5 * time.Minute, NoGitHosting: r > 0, ExternalURL: external}
		if o.Cells > 1 {
			cfg.CellID, cfg.NoGitHosting = int64(r+1), false
		}
		srv, err := embedded.Open(ctx, embedded.Options{DataDir: filepath.Join(dir, strconv.Itoa(r)), Listener: ln,
			Logger: slog.New(slog.DiscardHandler), Store: o.Store, Config: cfg})
		if err != nil {
			return nil, err
		}
		srvs = append(srvs, srv)
	}
	srv := srvs[0]
	// Each cell has an admin token of its own; replicas share one.
	admins := make([]string, len(srvs))
	for i := range srvs {
		if i > 0 && o.Cells <= 1 {
			admins[i] = admins[0]
			continue
		}
		if admins[i], err = srvs[i].EnsureAdminToken(ctx, ""); err != nil {
			return nil, err
		}
	}
	// base is where runner i talks: its replica, or the router.
	base := func(i int) string { return srvs[i%len(srvs)].URL }
	if o.Cells > 1 {
		rcfg := router.Config{ExternalURL: external, HealthInterval: time.Second, HealthTimeout: time.Second, UnhealthyAfter: 3}
		for i, a := range addrs {
			rcfg.Cells = append(rcfg.Cells, router.Cell{ID: int64(i + 1), URL: a})
		}
		rt, err := router.New(rcfg, router.Options{})
		if err != nil {
			return nil, err
		}
		rctx, stopRouter := context.WithCancel(ctx)
		hs := &http.Server{Handler: rt, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = hs.Serve(routerLn) }()
		go func() { _ = rt.Run(rctx) }()
		defer func() { stopRouter(); hs.Close() }()
		base = func(int) string { return external }
	}

	tr := &http.Transport{MaxIdleConns: o.Runners * 2, MaxIdleConnsPerHost: o.Runners * 2, MaxConnsPerHost: 0}
	if o.RTT > 0 {
		tr.DialContext = delayDialer(o.RTT / 2)
	}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	// Runner i belongs to coordinator i mod len(srvs) (replicas share the
	// store, so any of them could make it; cells will not).
	tokens := make([]string, o.Runners)
	for i := range tokens {
		admin := client.New(base(i), admins[i%len(srvs)])
		req := restapi.CreateRunnerRequest{RunnerType: "instance_type", Description: "bench-" + strconv.Itoa(i)}
		if o.Replicas > 1 && i%len(srvs) != 0 {
			// Runners of the other replicas also take the latency
			// phase's "far" jobs, which the first replica's cannot:
			// those cross replicas.
			req.TagList, req.RunUntagged = runnerapi.TagList{farTag}, new(true)
		}
		resp, err := admin.CreateRunner(ctx, req)
		if err != nil {
			return nil, fmt.Errorf("creating runner %d: %w", i, err)
		}
		tokens[i] = resp.Token
	}

	type pickup struct {
		id      int64
		at      time.Time
		replica int
	}
	received := make(chan pickup, o.Jobs+o.LatencyJobs)
	var failures atomic.Int64
	cctx, stopClients := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i := 0; i < o.Runners; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			lp := &benchRunner{hc: hc, base: base(i), token: tokens[i], systemID: "s_bench" + strconv.Itoa(i)}
			got := func(id int64) { received <- pickup{id, time.Now(), i % len(srvs)} }
			failed := func() { failures.Add(1) }
			if o.Push {
				(&benchPusher{benchRunner: lp, capacity: o.Capacity, restAck: o.PushRESTAck}).serve(cctx, got, failed)
				return
			}
			lp.serve(cctx, o.Capacity, o.RequestConcurrency, got, failed)
		}(i)
	}
	defer func() { stopClients(); wg.Wait() }()

	waitHeld := func() error {
		deadline := time.Now().Add(time.Minute)
		waiting := func() int {
			n := 0
			for _, srv := range srvs {
				n += srv.Queue().Waiting()
			}
			return n
		}
		held := o.Runners
		if !o.Push {
			held *= o.RequestConcurrency
		}
		for waiting() < held {
			if time.Now().After(deadline) {
				return fmt.Errorf("only %d of %d hand-outs are waiting after a minute (%d request failures)", waiting(), held, failures.Load())
			}
			time.Sleep(5 * time.Millisecond)
		}
		return nil
	}
	spec := dispatch.JobSpec{Name: "bench", ProjectID: 1, Steps: []runnerapi.Step{{Name: "script", Script: []string{"true"}, When: "on_success"}}}

	// Throughput phase.
	if err := waitHeld(); err != nil {
		return nil, err
	}
	fmt.Fprintf(o.Progress, "throughput: %d runners waiting, enqueueing %d jobs\n", o.Runners, o.Jobs)
	if o.CPUProfile != nil {
		if err := pprof.StartCPUProfile(o.CPUProfile); err != nil {
			return nil, fmt.Errorf("profiling: %w", err)
		}
	}
	start := time.Now()
	cpu0, cpuKnown := processCPU()
	var next atomic.Int64
	var ew sync.WaitGroup
	enqErr := make(chan error, o.Enqueuers)
	for e := 0; e < o.Enqueuers; e++ {
		ew.Add(1)
		go func() {
			defer ew.Done()
			srv := srvs[e%len(srvs)]
			for next.Add(1) <= int64(o.Jobs) {
				if _, err := srv.Enqueue(ctx, spec); err != nil {
					enqErr <- err
					return
				}
			}
		}()
	}
	tick := time.NewTicker(time.Second)
	for got := 0; got < o.Jobs; {
		select {
		case <-received:
			got++
		case err := <-enqErr:
			return nil, fmt.Errorf("enqueueing: %w", err)
		case <-tick.C:
			fmt.Fprintf(o.Progress, "throughput: %d/%d jobs picked up\n", got, o.Jobs)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	tick.Stop()
	elapsed := time.Since(start)
	cpu1, _ := processCPU()
	if o.CPUProfile != nil {
		pprof.StopCPUProfile()
	}
	if o.AllocProfile != nil {
		if err := pprof.Lookup("allocs").WriteTo(o.AllocProfile, 0); err != nil {
			return nil, fmt.Errorf("profiling: %w", err)
		}
	}
	ew.Wait()
	channel := ChannelLongPoll
	if o.Push {
		channel = ChannelPush
	}
	res := &DispatchResult{Channel: channel, Runners: o.Runners, Jobs: o.Jobs, CPUs: runtime.GOMAXPROCS(0), Seconds: elapsed.Seconds(),
		JobsPerSecond: float64(o.Jobs) / elapsed.Seconds(), LatencyJobs: o.LatencyJobs, Store: storeName, Replicas: o.Replicas,
		Capacity: o.Capacity, Burst: o.Burst, RTTMs: float64(o.RTT.Microseconds()) / 1000}
	if !o.Push {
		res.RequestConcurrency = o.RequestConcurrency
	}
	if o.Cells > 1 {
		res.Cells, res.Replicas = o.Cells, 1
	}
	if cpuKnown {
		res.CPUMsPerJob = float64((cpu1 - cpu0).Microseconds()) / 1000 / float64(o.Jobs)
	}

	// Latency phase.
	if o.LatencyJobs > 0 {
		lat := make([]time.Duration, 0, o.LatencyJobs)
		var cross []time.Duration
		for i := 0; i+o.Burst <= o.LatencyJobs; i += o.Burst {
			if err := waitHeld(); err != nil {
				return nil, err
			}
			// Replicas: every job on the first, every other one for
			// the others' runners only (farTag), so that those pickups
			// cross; cells: each cell in turn (a cell's jobs are its
			// runners' only).
			on := srv
			if o.Cells > 1 {
				on = srvs[(i/o.Burst)%len(srvs)]
			}
			enqueued := make(map[int64]time.Time, o.Burst)
			for k := range o.Burst {
				spec := spec
				if o.Replicas > 1 && (i+k)%2 == 1 {
					spec.Tags = []string{farTag}
				}
				t0 := time.Now()
				j, err := on.Enqueue(ctx, spec)
				if err != nil {
					return nil, fmt.Errorf("enqueueing: %w", err)
				}
				enqueued[j.ID] = t0
			}
			for range o.Burst {
				select {
				case p := <-received:
					t0, ok := enqueued[p.id]
					if !ok {
						return nil, fmt.Errorf("latency phase: got job %d, not one of the burst's", p.id)
					}
					lat = append(lat, p.at.Sub(t0))
					if p.replica != 0 && o.Cells <= 1 {
						cross = append(cross, p.at.Sub(t0))
					}
				case <-time.After(time.Minute):
					return nil, fmt.Errorf("latency phase: a job of the burst not picked up within a minute")
				}
			}
			if (i/o.Burst+1)%max(1, 500/o.Burst) == 0 {
				fmt.Fprintf(o.Progress, "latency: %d/%d jobs\n", i+o.Burst, o.LatencyJobs)
			}
		}
		slices.Sort(lat)
		ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
		res.PickupP50Ms = ms(lat[len(lat)/2])
		res.PickupP99Ms = ms(lat[(len(lat)*99)/100])
		res.PickupMaxMs = ms(lat[len(lat)-1])
		if len(cross) > 0 {
			slices.Sort(cross)
			res.CrossPickups = len(cross)
			res.CrossPickupP50Ms = ms(cross[len(cross)/2])
			res.CrossPickupP99Ms = ms(cross[(len(cross)*99)/100])
		}
	}
	return res, nil
}

// benchRunner is a minimal long-polling runner manager.
type benchRunner struct {
	hc         *http.Client
	base       string
	token      string
	systemID   string
	lastUpdate string
}

// serve takes jobs until ctx ends, as a runner manager with room for
// capacity jobs holding rc long polls: each poll that brings a job hands
// it to a worker (which acknowledges it; the job then ends at once) and
// polls again straight away, as GitLab's runner does.
func (c *benchRunner) serve(ctx context.Context, capacity, rc int, got func(int64), failed func()) {
	room := make(chan struct{}, capacity)
	var wg sync.WaitGroup
	for range rc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := *c // its own Last-Update
			for ctx.Err() == nil {
				select {
				case room <- struct{}{}:
				case <-ctx.Done():
					return
				}
				id, tok, err := p.request(ctx)
				if err != nil || id == 0 {
					<-room
					if err != nil && ctx.Err() == nil {
						failed()
						time.Sleep(10 * time.Millisecond)
					}
					continue
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer func() { <-room }()
					if err := c.ack(ctx, id, tok); err != nil {
						if ctx.Err() == nil {
							failed()
						}
						return
					}
					got(id)
				}()
			}
		}()
	}
	wg.Wait()
}

// payloadBuffers holds the buffers job payloads are read into.
var payloadBuffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// request asks for a job; it returns the job's id and token, or 0 when
// the long poll ended without one.
func (c *benchRunner) request(ctx context.Context) (int64, string, error) {
	req, _ := json.Marshal(runnerapi.JobRequest{Token: c.token, SystemID: c.systemID, LastUpdate: c.lastUpdate})
	resp, err := c.post(ctx, http.MethodPost, "/api/v4/jobs/request", req, "")
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	if v := resp.Header.Get(runnerapi.HeaderLastUpdate); v != "" {
		c.lastUpdate = v
	}
	switch resp.StatusCode {
	case http.StatusNoContent:
		return 0, "", nil
	case http.StatusCreated:
	default:
		io.Copy(io.Discard, resp.Body)
		return 0, "", fmt.Errorf("jobs/request: %s", resp.Status)
	}
	// The whole payload is read and parsed, as a runner does, into the two
	// fields the bench uses; its buffer is kept for the next job.
	body := payloadBuffers.Get().(*bytes.Buffer)
	defer payloadBuffers.Put(body)
	body.Reset()
	if _, err := body.ReadFrom(resp.Body); err != nil {
		return 0, "", err
	}
	var job struct {
		ID    int64  `json:"id"`
		Token string `json:"token"`
	}
	if err := json.Unmarshal(body.Bytes(), &job); err != nil {
		return 0, "", err
	}
	return job.ID, job.Token, nil
}

// ack acknowledges a job (PUT state=running).
func (c *benchRunner) ack(ctx context.Context, id int64, tok string) error {
	ack, _ := json.Marshal(runnerapi.UpdateJobRequest{Token: tok, State: runnerapi.StateRunning})
	resp, err := c.post(ctx, http.MethodPut, "/api/v4/jobs/"+strconv.FormatInt(id, 10), ack, tok)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("ack of job %d: %s", id, resp.Status)
	}
	return nil
}

// benchPusher is a minimal runner manager on the push channel: one
// stream with room for capacity jobs; each pushed job is admitted and
// acknowledged by a worker of its own, and once it ended (at once) the
// room is announced again.
type benchPusher struct {
	*benchRunner
	capacity int
	// restAck: acknowledge on REST, not by the admit on the stream.
	restAck bool
}

func (c *benchPusher) serve(ctx context.Context, got func(int64), failed func()) {
	for ctx.Err() == nil {
		if err := c.stream(ctx, got, failed); err != nil && ctx.Err() == nil {
			failed()
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// stream serves one stream until it ends.
func (c *benchPusher) stream(ctx context.Context, got func(int64), failed func()) error {
	u, err := jobpush.ServerURL(c.base)
	if err != nil {
		return err
	}
	s, err := jobpush.Dial(ctx, u, c.token, jobpush.DialOptions{HTTPClient: c.hc,
		Hello: jobpush.Hello{SystemID: c.systemID, Capacity: jobpush.Capacity{Free: uint32(c.capacity)}, Acknowledge: !c.restAck}})
	if err != nil {
		return err
	}
	defer s.Close()
	stop := context.AfterFunc(ctx, func() { s.Close() }) // Recv returns when the bench ends
	defer stop()
	var (
		mu      sync.Mutex // orders announcements
		seen    uint64
		running uint32
		wg      sync.WaitGroup
	)
	defer wg.Wait()
	for {
		j, err := s.Recv()
		if err != nil {
			return err
		}
		mu.Lock()
		seen++
		running++
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			var job struct {
				Token string `json:"token"`
			}
			err := json.Unmarshal(j.Payload, &job)
			var wait jobpush.AckWait
			if err == nil {
				wait, err = s.Admit(j.ID)
			}
			if err == nil {
				err = c.acknowledge(ctx, wait, j.ID, job.Token)
			}
			if err == nil {
				got(j.ID)
			} else if ctx.Err() == nil {
				failed()
			}
			mu.Lock()
			running--
			_ = s.Announce(jobpush.Capacity{Free: uint32(c.capacity) - running, Seen: seen})
			mu.Unlock()
		}()
	}
}

// acknowledge waits for the acknowledgement of an admitted job: on the
// stream when its admits acknowledge, on REST otherwise or when the
// stream ended first (as Berth's runner does).
func (c *benchPusher) acknowledge(ctx context.Context, wait jobpush.AckWait, id int64, tok string) error {
	if wait == nil {
		return c.ack(ctx, id, tok)
	}
	a, err := wait(ctx)
	switch jobpush.Verdict(a, err) {
	case jobpush.AckAccepted:
		return nil
	case jobpush.AckRefused:
		return fmt.Errorf("acknowledgement of job %d: %s: %s", id, a.Code, a.Message)
	}
	if err != nil && ctx.Err() != nil {
		return err
	}
	return c.ack(ctx, id, tok)
}

func (c *benchRunner) post(ctx context.Context, method, path string, body []byte, jobToken string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	if jobToken != "" {
		req.Header.Set(runnerapi.HeaderJobToken, jobToken)
	}
	return c.hc.Do(req)
}

// scratchSchema makes a schema of its own for one bench run in the
// database dsn names and returns dsn with it as the search path, and a
// function that drops it.
func scratchSchema(ctx context.Context, dsn string) (string, func(), error) {
	schema := fmt.Sprintf("berth_bench_%d", time.Now().UnixNano())
	scoped, err := pgurl.InSchema(dsn, schema)
	if err != nil {
		return "", nil, fmt.Errorf("--store: %w", err)
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return "", nil, err
	}
	if _, err := db.ExecContext(ctx, "CREATE SCHEMA "+schema); err != nil {
		db.Close()
		return "", nil, fmt.Errorf("creating a schema for the bench: %w", err)
	}
	return scoped, func() {
		_, _ = db.ExecContext(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
		db.Close()
	}, nil
}

// farTag marks the latency phase's jobs that only runners of replicas
// other than the first may run (--replicas): every other job. The first
// replica, where they are enqueued, hands a job straight to a runner of
// its own that waits; these must reach another replica.
const farTag = "bench-far"
