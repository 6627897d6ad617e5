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
	"github.com/berthci/berth/coordinator/store/postgres"
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
	// the first, so most pickups there cross replicas.
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
	// Progress, if set, receives a line now and then.
	Progress io.Writer
	// CPUProfile, if set, receives a CPU profile of the bench's process
	// during the throughput phase (pprof format).
	CPUProfile io.Writer
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
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	// Runner i belongs to coordinator i mod len(srvs) (replicas share the
	// store, so any of them could make it; cells will not).
	tokens := make([]string, o.Runners)
	for i := range tokens {
		admin := client.New(base(i), admins[i%len(srvs)])
		resp, err := admin.CreateRunner(ctx, restapi.CreateRunnerRequest{RunnerType: "instance_type", Description: "bench-" + strconv.Itoa(i)})
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
			var c benchClient = lp
			if o.Push {
				c = &benchPusher{benchRunner: lp}
			}
			defer c.close()
			for cctx.Err() == nil {
				id, err := c.next(cctx)
				if err != nil {
					if cctx.Err() == nil {
						failures.Add(1)
						time.Sleep(10 * time.Millisecond)
					}
					continue
				}
				if id != 0 {
					received <- pickup{id, time.Now(), i % len(srvs)}
				}
			}
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
		for waiting() < o.Runners {
			if time.Now().After(deadline) {
				return fmt.Errorf("only %d of %d runners are waiting after a minute (%d request failures)", waiting(), o.Runners, failures.Load())
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
	ew.Wait()
	channel := ChannelLongPoll
	if o.Push {
		channel = ChannelPush
	}
	res := &DispatchResult{Channel: channel, Runners: o.Runners, Jobs: o.Jobs, CPUs: runtime.GOMAXPROCS(0), Seconds: elapsed.Seconds(),
		JobsPerSecond: float64(o.Jobs) / elapsed.Seconds(), LatencyJobs: o.LatencyJobs, Store: storeName, Replicas: o.Replicas}
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
		for i := 0; i < o.LatencyJobs; i++ {
			if err := waitHeld(); err != nil {
				return nil, err
			}
			// Replicas: every job on the first, so that pickups cross to
			// the others; cells: each cell in turn (a cell's jobs are its
			// runners' only).
			on := srv
			if o.Cells > 1 {
				on = srvs[i%len(srvs)]
			}
			t0 := time.Now()
			j, err := on.Enqueue(ctx, spec)
			if err != nil {
				return nil, fmt.Errorf("enqueueing: %w", err)
			}
			select {
			case p := <-received:
				if p.id != j.ID {
					return nil, fmt.Errorf("latency phase: got job %d, want %d", p.id, j.ID)
				}
				lat = append(lat, p.at.Sub(t0))
				if p.replica != 0 && o.Cells <= 1 {
					cross = append(cross, p.at.Sub(t0))
				}
			case <-time.After(time.Minute):
				return nil, fmt.Errorf("latency phase: job %d not picked up within a minute", j.ID)
			}
			if (i+1)%500 == 0 {
				fmt.Fprintf(o.Progress, "latency: %d/%d jobs\n", i+1, o.LatencyJobs)
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

// benchClient is one simulated runner manager.
type benchClient interface {
	// next takes a job and acknowledges it; it returns the job's id, or
	// 0 when none came.
	next(ctx context.Context) (int64, error)
	close()
}

// benchRunner is a minimal long-polling runner manager.
type benchRunner struct {
	hc         *http.Client
	base       string
	token      string
	systemID   string
	lastUpdate string
}

// next asks for a job and acknowledges it; it returns the job id, or 0
// when the long poll ended without one.
func (c *benchRunner) next(ctx context.Context) (int64, error) {
	body, _ := json.Marshal(runnerapi.JobRequest{Token: c.token, SystemID: c.systemID, LastUpdate: c.lastUpdate})
	resp, err := c.post(ctx, http.MethodPost, "/api/v4/jobs/request", body, "")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if v := resp.Header.Get(runnerapi.HeaderLastUpdate); v != "" {
		c.lastUpdate = v
	}
	switch resp.StatusCode {
	case http.StatusNoContent:
		return 0, nil
	case http.StatusCreated:
	default:
		io.Copy(io.Discard, resp.Body)
		return 0, fmt.Errorf("jobs/request: %s", resp.Status)
	}
	var job struct {
		ID    int64  `json:"id"`
		Token string `json:"token"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&job); err != nil {
		return 0, err
	}
	if err := c.ack(ctx, job.ID, job.Token); err != nil {
		return 0, err
	}
	return job.ID, nil
}

func (c *benchRunner) close() {}

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
// stream with room for one job, announced again once the job it got is
// acknowledged (as a runner whose job ended at once would).
type benchPusher struct {
	*benchRunner
	s    *jobpush.Stream
	seen uint64
}

func (c *benchPusher) next(ctx context.Context) (int64, error) {
	if c.s == nil {
		u, err := jobpush.ServerURL(c.base)
		if err != nil {
			return 0, err
		}
		s, err := jobpush.Dial(ctx, u, c.token, jobpush.DialOptions{HTTPClient: c.hc,
			Hello: jobpush.Hello{SystemID: c.systemID, Capacity: jobpush.Capacity{Free: 1}}})
		if err != nil {
			return 0, err
		}
		c.s, c.seen = s, 0
		context.AfterFunc(ctx, func() { s.Close() }) // Recv returns when the bench ends
	}
	j, err := c.s.Recv()
	if err != nil {
		c.s.Close()
		c.s = nil
		return 0, err
	}
	c.seen++
	var job struct {
		Token string `json:"token"`
	}
	if err := json.Unmarshal(j.Payload, &job); err != nil {
		return 0, err
	}
	if err := c.s.Admit(j.ID); err != nil {
		return 0, err
	}
	if err := c.ack(ctx, j.ID, job.Token); err != nil {
		return 0, err
	}
	if err := c.s.Announce(jobpush.Capacity{Free: 1, Seen: c.seen}); err != nil {
		return 0, err
	}
	return j.ID, nil
}

func (c *benchPusher) close() {
	if c.s != nil {
		c.s.Close()
	}
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
	scoped, err := postgres.InSchema(dsn, schema)
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
