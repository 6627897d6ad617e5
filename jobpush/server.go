package jobpush

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/berthci/berth/jobpush/internal/pb"
)

// Source is what a Server pushes: the coordinator's jobs.
type Source interface {
	// Open begins the session of a stream: it authenticates token (an
	// error wrapping ErrUnauthenticated when it does not), records the
	// runner manager of hello and notes what it offers. ctx is the
	// stream's.
	Open(ctx context.Context, token string, hello Hello) (Session, error)
}

// Session is one stream's view of the coordinator. Next is called by one
// goroutine at a time; Admitted and Release may be called concurrently
// with it and with each other, each at most once per job; Close last.
type Session interface {
	// Next hands out the next job the runner may run, waiting for one
	// until ctx ends or the session's own bound passes; nil, nil when
	// none came (the Server asks again while the runner has room). Each
	// call checks the runner anew: an error ends the stream (wrapping
	// ErrUnauthenticated when the runner's token no longer
	// authenticates). A job handed out is the session's until Admitted or
	// Release.
	Next(ctx context.Context) (*Job, error)
	// Admitted: the runner admitted job id; it acknowledges it on REST.
	Admitted(id int64)
	// Acknowledge: the runner admitted job id on a stream whose admits
	// acknowledge (Hello.Acknowledge): record the acknowledgement as PUT
	// /jobs/:id state=running would, and say what came of it. Called
	// instead of Admitted; ctx does not end with the stream (an admit
	// that arrived is recorded whatever happens to the stream after).
	Acknowledge(ctx context.Context, id int64) Ack
	// Release puts job id back into the queue: the runner rejected it, it
	// could not be sent, or the stream ended before the runner answered.
	// A job the runner acknowledged meanwhile stays with it.
	Release(ctx context.Context, id int64) error
	// Close ends the session.
	Close()
}

// ServerOptions configure a Server.
type ServerOptions struct {
	Logger *slog.Logger // nil: discard
	// Registerer receives the channel's metrics (nil: none).
	Registerer prometheus.Registerer
	// HelloTimeout bounds the wait for a stream's Hello (default 30 s).
	HelloTimeout time.Duration
}

// Server serves the push channel: Upgrade turns a request into a tunnel,
// and each Push stream on it runs against the Source.
//
//	NewServer ──► Upgrade (any number, concurrently) ──► Close
type Server struct {
	pb.UnimplementedJobPushServer
	src          Source
	log          *slog.Logger
	grpc         *grpc.Server
	ln           *tunnelListener
	helloTimeout time.Duration
	metrics      serverMetrics
	served       chan struct{}
}

type serverMetrics struct {
	streams prometheus.Gauge
	jobs    *prometheus.CounterVec
}

// Keepalive of the channel: the server pings an idle tunnel every
// serverPing and drops it when the ping is not answered within
// pingTimeout, so that a vanished runner's unanswered jobs go back to the
// queue; it lets runners ping every clientPing (GitLab's runner: 55 s).
const (
	serverPing  = 30 * time.Second
	clientPing  = 55 * time.Second
	pingTimeout = 20 * time.Second
)

// windowSize is the channel's HTTP/2 flow control window, per stream and
// per connection: a job's payload fits in it.
const windowSize = 4 << 20

// NewServer returns a Server over src, serving from now until Close.
func NewServer(src Source, opts ServerOptions) *Server {
	s := &Server{src: src, log: opts.Logger, ln: newTunnelListener(), helloTimeout: opts.HelloTimeout, served: make(chan struct{})}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.helloTimeout <= 0 {
		s.helloTimeout = 30 * time.Second
	}
	s.metrics = serverMetrics{
		streams: prometheus.NewGauge(prometheus.GaugeOpts{Name: "berth_coordinator_push_streams",
			Help: "Job push streams open."}),
		jobs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "berth_coordinator_push_jobs_total",
			Help: "Jobs pushed to runners by what came of them: admitted, rejected (back to the queue), released (the stream ended first, back to the queue); acknowledged counts the admits recorded as the jobs' acknowledgements."},
			[]string{"outcome"}),
	}
	if reg := opts.Registerer; reg != nil {
		for _, c := range []prometheus.Collector{s.metrics.streams, s.metrics.jobs} {
			_ = reg.Register(c) // a second coordinator on one registry keeps the first's
		}
	}
	s.grpc = grpc.NewServer(
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: serverPing, Timeout: pingTimeout}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: clientPing / 2, PermitWithoutStream: true}),
		grpc.MaxRecvMsgSize(MaxInfo+(1<<20)),
		// Fixed flow control windows: no BDP pings beside every message
		// (a frame each way, through the tunnel, per job).
		grpc.InitialWindowSize(windowSize), grpc.InitialConnWindowSize(windowSize),
		grpc.MaxSendMsgSize(MaxPayload+(1<<20)),
		// Close waits for the streams' handlers: their jobs are released
		// before the coordinator closes its store.
		grpc.WaitForHandlers(true),
	)
	pb.RegisterJobPushServer(s.grpc, s)
	if p, ok := src.(Puller); ok {
		pb.RegisterJobRouterServer(s.grpc, &jobRouter{s: s, src: p})
	}
	go func() {
		defer close(s.served)
		_ = s.grpc.Serve(s.ln)
	}()
	return s
}

// Upgrade turns r (GET Path, its runner token already checked by the
// caller, which answers refusals in its API's form) into a tunnel served
// by the gRPC server. It returns when the tunnel closes.
func (s *Server) Upgrade(w http.ResponseWriter, r *http.Request) {
	c, err := upgrade(w, r)
	if err != nil {
		s.log.Debug("push channel upgrade refused", "err", err)
		return
	}
	if !s.ln.hand(c) {
		_ = c.Close()
		return
	}
	<-c.closed
}

// Close ends every stream (their unanswered jobs are released) and stops
// serving. Upgrades after Close are closed at once.
func (s *Server) Close() {
	s.ln.Close()
	s.grpc.Stop()
	<-s.served
}

// BearerToken returns the token of an Authorization: Bearer value.
func BearerToken(authorization string) string {
	if len(authorization) > 7 && strings.EqualFold(authorization[:7], "Bearer ") {
		return strings.TrimSpace(authorization[7:])
	}
	return ""
}

// callToken is the runner token of a call's metadata (authorization:
// Bearer, as GitLab's runner sends it).
func callToken(md metadata.MD) (string, error) {
	if v := md.Get("authorization"); len(v) > 0 {
		if t := BearerToken(v[0]); t != "" {
			return t, nil
		}
	}
	return "", status.Error(codes.Unauthenticated, "authorization: Bearer <runner token> is missing")
}

// Push serves one stream.
func (s *Server) Push(stream pb.JobPush_PushServer) error {
	md, _ := metadata.FromIncomingContext(stream.Context())
	token, err := callToken(md)
	if err != nil {
		return err
	}
	hello, err := s.recvHello(stream)
	if err != nil {
		return err
	}
	sess, err := s.src.Open(stream.Context(), token, hello)
	if err != nil {
		return s.statusOf(err)
	}
	defer sess.Close()
	out := &sender{stream: stream}
	if err := out.send(&pb.CoordinatorMessage{Message: &pb.CoordinatorMessage_Ready{Ready: &pb.Ready{Acknowledge: hello.Acknowledge}}}); err != nil {
		return err
	}
	s.metrics.streams.Inc()
	defer s.metrics.streams.Dec()
	log := s.log.With("system_id", hello.SystemID)
	log.Debug("push stream open", "free", hello.Capacity.Free, "acknowledge", hello.Acknowledge)

	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	st := newStreamState(hello.Capacity)
	recvErr := make(chan error, 1)
	go func() {
		recvErr <- s.receive(stream, out, hello.Acknowledge, st, sess)
		cancel()
	}()
	err = s.pushJobs(ctx, out, st, sess)
	// Whatever ended the stream, the jobs the runner did not answer go
	// back to the queue (a runner that acknowledged one on REST
	// meanwhile keeps it: Release leaves it). Answers still being
	// handled finish first; later ones find nothing pending.
	unanswered := st.close()
	st.calls.Lock()
	defer st.calls.Unlock()
	for _, id := range unanswered {
		if rerr := sess.Release(context.Background(), id); rerr != nil {
			log.Warn("releasing a pushed job the runner did not answer", "job_id", id, "err", rerr)
		}
		s.metrics.jobs.WithLabelValues("released").Inc()
	}
	if ctx.Err() != nil && stream.Context().Err() == nil {
		// The receiving side ended the stream (the runner closed it, or
		// broke the protocol).
		err = <-recvErr
		if errors.Is(err, io.EOF) {
			err = nil
		}
	}
	log.Debug("push stream closed", "err", err)
	if err != nil {
		return s.statusOf(err)
	}
	return nil
}

// recvHello reads the stream's first message, which must be a valid
// Hello, within helloTimeout.
func (s *Server) recvHello(stream pb.JobPush_PushServer) (Hello, error) {
	type result struct {
		m   *pb.RunnerMessage
		err error
	}
	got := make(chan result, 1)
	go func() {
		m, err := stream.Recv()
		got <- result{m, err}
	}()
	var r result
	select {
	case r = <-got:
	case <-time.After(s.helloTimeout):
		return Hello{}, status.Error(codes.DeadlineExceeded, "no hello")
	}
	if r.err != nil {
		return Hello{}, r.err
	}
	h := r.m.GetHello()
	if h == nil {
		return Hello{}, status.Error(codes.InvalidArgument, "the first message must be a hello")
	}
	hello, err := helloFromPB(h)
	if err != nil {
		return Hello{}, status.Error(codes.InvalidArgument, err.Error())
	}
	return hello, nil
}

// helloFromPB checks a Hello off the wire.
func helloFromPB(h *pb.Hello) (Hello, error) {
	if err := CheckSystemID(h.GetSystemId()); err != nil {
		return Hello{}, err
	}
	info, err := DecodeInfo(h.GetInfo())
	if err != nil {
		return Hello{}, err
	}
	return Hello{SystemID: h.GetSystemId(), Info: info, Capacity: capacityFromPB(h.GetCapacity()), Acknowledge: h.GetAcknowledge()}, nil
}

func capacityFromPB(c *pb.Capacity) Capacity {
	return Capacity{Free: c.GetFree(), Seen: c.GetSeen()}
}

// statusOf maps an error to the stream's gRPC status, once, here.
func (s *Server) statusOf(err error) error {
	if _, ok := status.FromError(err); ok {
		return err
	}
	switch {
	case errors.Is(err, ErrUnauthenticated):
		return status.Error(codes.Unauthenticated, "403 Forbidden")
	case errors.Is(err, ErrOrphaned):
		return status.Error(codes.FailedPrecondition, "runner is orphaned")
	case errors.Is(err, ErrBadHello), errors.Is(err, ErrBadRequest):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, "stream ended")
	}
	s.log.Error("push stream failed", "err", err)
	return status.Error(codes.Internal, "internal error")
}

// pushJobs hands out jobs while the runner has room, until ctx ends.
func (s *Server) pushJobs(ctx context.Context, out *sender, st *streamState, sess Session) error {
	for {
		wait, ok := st.waitForRoom(ctx)
		if !ok {
			return ctx.Err()
		}
		j, err := sess.Next(wait)
		room := st.endWait()
		if err != nil {
			return err
		}
		if j == nil {
			continue
		}
		if !room || ctx.Err() != nil {
			// The runner filled up (or left) while the job came: it goes
			// back rather than to a certain reject.
			if err := sess.Release(context.WithoutCancel(ctx), j.ID); err != nil {
				s.log.Warn("releasing a job handed out as the runner filled up", "job_id", j.ID, "err", err)
			}
			continue
		}
		st.pushed(j.ID)
		if err := out.send(&pb.CoordinatorMessage{Message: &pb.CoordinatorMessage_Job{Job: &pb.Job{Id: j.ID, Payload: j.Payload}}}); err != nil {
			return err // released as unanswered
		}
	}
}

// sender serializes a stream's sends: jobs, and acknowledgements
// answered concurrently.
type sender struct {
	mu     sync.Mutex
	stream pb.JobPush_PushServer
}

func (o *sender) send(m *pb.CoordinatorMessage) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.stream.Send(m)
}

// receive reads the runner's capacity and answers until the stream ends;
// on a stream whose admits acknowledge (acks), each admit is recorded and
// answered while the next messages are read.
func (s *Server) receive(stream pb.JobPush_PushServer, out *sender, acks bool, st *streamState, sess Session) error {
	for {
		m, err := stream.Recv()
		if err != nil {
			return err
		}
		switch m := m.GetMessage().(type) {
		case *pb.RunnerMessage_Capacity:
			st.announce(capacityFromPB(m.Capacity))
		case *pb.RunnerMessage_Answer:
			s.answer(stream.Context(), m.Answer, out, acks, st, sess)
		case *pb.RunnerMessage_Hello:
			return status.Error(codes.InvalidArgument, "hello twice")
		default:
			// A newer runner's message: ignored (additive protocol).
		}
	}
}

// answer applies the runner's answer to a pushed job. An admit that
// acknowledges is recorded and answered by a goroutine of its own, which
// the stream's end waits for (it holds calls).
func (s *Server) answer(ctx context.Context, a *pb.Answer, out *sender, acks bool, st *streamState, sess Session) {
	st.calls.RLock()
	id, code := a.GetJobId(), codes.Code(a.GetCode())
	if !st.answered(id, code != codes.OK) {
		if acks && code == codes.OK {
			// Released as the stream ended, or never pushed here: the
			// runner drops it. (Sent while calls is held: the handler
			// has not returned.)
			_ = out.send(ackMessage(Ack{JobID: id, Code: codes.FailedPrecondition, Message: "job " + strconv.FormatInt(id, 10) + " is not waiting for this stream's answer"}))
		}
		st.calls.RUnlock()
		return
	}
	if code == codes.OK && acks {
		s.metrics.jobs.WithLabelValues("admitted").Inc()
		go func() {
			defer st.calls.RUnlock()
			ack := sess.Acknowledge(context.WithoutCancel(ctx), id)
			ack.JobID = id
			if ack.Code == codes.OK {
				s.metrics.jobs.WithLabelValues("acknowledged").Inc()
			} else {
				s.log.Debug("pushed job not acknowledged", "job_id", id, "code", ack.Code, "message", ack.Message)
			}
			_ = out.send(ackMessage(ack)) // a stream that ended: the runner asks on REST
		}()
		return
	}
	defer st.calls.RUnlock()
	if code == codes.OK {
		sess.Admitted(id)
		s.metrics.jobs.WithLabelValues("admitted").Inc()
		return
	}
	s.metrics.jobs.WithLabelValues("rejected").Inc()
	s.log.Debug("pushed job rejected", "job_id", id, "code", code, "message", a.GetMessage())
	if err := sess.Release(context.WithoutCancel(ctx), id); err != nil {
		s.log.Warn("releasing a rejected job", "job_id", id, "err", err)
	}
}

// ackMessage is the wire form of an Ack.
func ackMessage(a Ack) *pb.CoordinatorMessage {
	return &pb.CoordinatorMessage{Message: &pb.CoordinatorMessage_Acknowledged{Acknowledged: &pb.Acknowledged{
		JobId: a.JobID, Code: uint32(a.Code), Message: a.Message, JobStatus: a.JobStatus,
		TraceUpdateInterval: uint32(a.TraceUpdateInterval / time.Second)}}}
}

// streamState is the coordinator's view of one stream's runner: the
// capacity it last announced, the jobs pushed since, and those not yet
// answered. Its methods are safe for concurrent use.
type streamState struct {
	mu sync.Mutex
	// free and seen are the last announcement; sent counts the jobs
	// pushed on the stream.
	free    uint32
	seen    uint64
	sent    uint64
	pending map[int64]bool
	// changed is closed (and replaced) whenever the view may have grown.
	changed chan struct{}
	// stopWait cancels the hand-out waiting, when the room is gone.
	stopWait context.CancelFunc
	closed   bool
	// calls is held (read) while an answer is applied to the session,
	// and (write) while the stream's end releases the rest.
	calls sync.RWMutex
}

func newStreamState(c Capacity) *streamState {
	return &streamState{free: c.Free, seen: c.Seen, pending: map[int64]bool{}, changed: make(chan struct{})}
}

// room is how many more jobs the runner can take as the coordinator sees
// it: the announced free room less the jobs pushed after the runner
// counted it. Called with mu held.
func (st *streamState) room() int64 {
	after := int64(0)
	if st.sent > st.seen {
		after = int64(st.sent - st.seen)
	}
	return int64(st.free) - after
}

// waitForRoom blocks until the runner has room and returns the context a
// hand-out waits under: cancelled when the room is gone or ctx ends.
func (st *streamState) waitForRoom(ctx context.Context) (context.Context, bool) {
	st.mu.Lock()
	for ctx.Err() == nil && st.room() <= 0 {
		ch := st.changed
		st.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, false
		}
		st.mu.Lock()
	}
	defer st.mu.Unlock()
	if ctx.Err() != nil {
		return nil, false
	}
	wait, cancel := context.WithCancel(ctx)
	st.stopWait = cancel
	return wait, true
}

// endWait ends a hand-out's wait and reports whether the runner still
// has room.
func (st *streamState) endWait() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.stopWait != nil {
		st.stopWait()
		st.stopWait = nil
	}
	return st.room() > 0
}

// changedLocked wakes a wait for room and stops a hand-out's wait when
// the room is gone.
func (st *streamState) changedLocked() {
	if st.room() > 0 {
		close(st.changed)
		st.changed = make(chan struct{})
		return
	}
	if st.stopWait != nil {
		st.stopWait()
	}
}

// announce applies a capacity announcement.
func (st *streamState) announce(c Capacity) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.free, st.seen = c.Free, c.Seen
	st.changedLocked()
}

// pushed records a job about to be sent.
func (st *streamState) pushed(id int64) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.sent++
	st.pending[id] = true
}

// answered records the runner's answer to a pending job and reports
// whether it was pending; a reject leaves the runner no room until it
// announces its capacity again.
func (st *streamState) answered(id int64, rejected bool) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	if !st.pending[id] || st.closed {
		return false
	}
	delete(st.pending, id)
	if rejected {
		st.free, st.seen = 0, st.sent
		st.changedLocked()
	}
	return true
}

// close ends the stream's state and returns the jobs left unanswered.
func (st *streamState) close() []int64 {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.closed = true
	ids := make([]int64, 0, len(st.pending))
	for id := range st.pending {
		ids = append(ids, id)
	}
	clear(st.pending)
	return ids
}
