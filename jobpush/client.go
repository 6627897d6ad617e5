package jobpush

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/berthci/berth/jobpush/internal/pb"
)

// DialOptions configure Dial.
type DialOptions struct {
	// HTTPClient carries the WebSocket handshake (nil: a default client;
	// its Timeout bounds only the handshake).
	HTTPClient *http.Client
	// Header is sent with the handshake (User-Agent, ...).
	Header http.Header
	// Hello opens the stream.
	Hello Hello
}

// Stream is a runner's open push stream. Recv is called by one goroutine
// (it also receives the acknowledgements an Admit's AckWait waits for);
// Announce, Admit, Reject and the waits may be called concurrently with
// it and with each other. Close it when done.
type Stream struct {
	cc     *grpc.ClientConn
	call   pb.JobPush_PushClient
	cancel context.CancelFunc
	acks   bool

	sendMu sync.Mutex

	mu      sync.Mutex
	waiting map[int64]chan Ack // admits whose acknowledgement is awaited
	ended   chan struct{}      // closed when the stream ended
	endOnce sync.Once
}

// ErrStreamEnded: the stream ended before the coordinator answered an
// admit; it may or may not have recorded it (the runner asks on REST).
var ErrStreamEnded = errors.New("push stream ended before the acknowledgement")

// Dial opens a push stream at serverURL (ws:// or wss://, from discovery)
// for the runner of token: the WebSocket handshake, the gRPC stream, the
// Hello, and the coordinator's Ready, all within ctx. It fails with an
// error matching ErrNotServed when nothing serves the channel there
// (404 on the upgrade, or a gRPC server without the service, such as
// GitLab's Job Router), ErrUnauthenticated when the token is refused, and
// otherwise with the transport's error.
func Dial(ctx context.Context, serverURL, token string, o DialOptions) (*Stream, error) {
	info, err := json.Marshal(o.Hello.Info)
	if err != nil {
		return nil, fmt.Errorf("encoding hello info: %w", err)
	}
	if o.Hello.Info == nil {
		info = nil
	}
	u, err := url.Parse(serverURL)
	if err != nil {
		return nil, fmt.Errorf("push channel URL: %w", err)
	}
	hc := o.HTTPClient
	if hc == nil {
		hc = http.DefaultClient
	}
	conn, err := dialTunnel(ctx, serverURL, token, hc, o.Header)
	if err != nil {
		return nil, err
	}
	// The gRPC client gets this one tunnel; when it breaks, the stream
	// ends and the caller dials anew.
	var once sync.Once
	dialer := func(context.Context, string) (net.Conn, error) {
		var c net.Conn
		once.Do(func() { c = conn })
		if c == nil {
			return nil, errors.New("push channel tunnel closed")
		}
		return c, nil
	}
	cc, err := tunnelClient(u, dialer)
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("push channel client: %w", err)
	}
	sctx, cancel := context.WithCancel(context.Background())
	s := &Stream{cc: cc, cancel: cancel, waiting: map[int64]chan Ack{}, ended: make(chan struct{})}
	fail := func(err error) (*Stream, error) {
		s.Close()
		_ = conn.Close()
		return nil, classify(err)
	}
	// Until Ready, ctx bounds the stream too.
	stop := context.AfterFunc(ctx, cancel)
	defer stop()
	sctx = metadata.AppendToOutgoingContext(sctx, "authorization", "Bearer "+token)
	if s.call, err = pb.NewJobPushClient(cc).Push(sctx); err != nil {
		return fail(err)
	}
	hello := &pb.Hello{SystemId: o.Hello.SystemID, Info: info, Capacity: capacityToPB(o.Hello.Capacity), Acknowledge: o.Hello.Acknowledge}
	if err := s.call.Send(&pb.RunnerMessage{Message: &pb.RunnerMessage_Hello{Hello: hello}}); err != nil {
		if _, rerr := s.call.Recv(); rerr != nil {
			err = rerr // the status the server ended the call with
		}
		return fail(err)
	}
	m, err := s.call.Recv()
	if err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return fail(err)
	}
	if m.GetReady() == nil {
		return fail(status.Error(codes.Internal, "the coordinator did not answer the hello with ready"))
	}
	s.acks = o.Hello.Acknowledge && m.GetReady().GetAcknowledge()
	return s, nil
}

// tunnelClient is a gRPC client of the coordinator at u whose
// connections are the tunnels dialer opens.
func tunnelClient(u *url.URL, dialer func(context.Context, string) (net.Conn, error)) (*grpc.ClientConn, error) {
	return grpc.NewClient("passthrough:///"+u.Host, append(clientOptions(),
		grpc.WithContextDialer(dialer),
		grpc.WithTransportCredentials(insecure.NewCredentials()), // the tunnel is wss where it matters
		grpc.WithInitialWindowSize(windowSize), grpc.WithInitialConnWindowSize(windowSize),
	)...)
}

// clientOptions are every runner-side connection's: keepalive as
// GitLab's runner pings, room for the largest payload.
func clientOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: clientPing, Timeout: pingTimeout, PermitWithoutStream: true}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxPayload + (1 << 20))),
	}
}

// classify makes a gRPC failure match the package's errors.
func classify(err error) error {
	switch status.Code(err) {
	case codes.Unimplemented:
		return fmt.Errorf("%w: %w", ErrNotServed, err)
	case codes.Unauthenticated, codes.PermissionDenied:
		return fmt.Errorf("%w: %w", ErrUnauthenticated, err)
	}
	return err
}

func capacityToPB(c Capacity) *pb.Capacity { return &pb.Capacity{Free: c.Free, Seen: c.Seen} }

// Recv waits for the next pushed job, handing the acknowledgements that
// come meanwhile to the admits waiting for them. It fails when the stream
// ends (io.EOF when the coordinator ended it without an error).
func (s *Stream) Recv() (*Job, error) {
	for {
		m, err := s.call.Recv()
		if err != nil {
			s.end()
			return nil, classify(err)
		}
		switch {
		case m.GetJob() != nil:
			j := m.GetJob()
			return &Job{ID: j.GetId(), Payload: j.GetPayload()}, nil
		case m.GetAcknowledged() != nil:
			s.acknowledged(m.GetAcknowledged())
		}
		// Another Ready, or a newer coordinator's message: ignored.
	}
}

// Acknowledges reports whether the stream's admits acknowledge their
// jobs: the Hello asked for it and the coordinator's Ready agreed.
func (s *Stream) Acknowledges() bool { return s.acks }

// acknowledged hands an acknowledgement to the admit awaiting it.
func (s *Stream) acknowledged(a *pb.Acknowledged) {
	s.mu.Lock()
	ch := s.waiting[a.GetJobId()]
	delete(s.waiting, a.GetJobId())
	s.mu.Unlock()
	if ch != nil { // else not admitted here, or answered already
		ch <- Ack{JobID: a.GetJobId(), Code: codes.Code(a.GetCode()), Message: a.GetMessage(), JobStatus: a.GetJobStatus(),
			TraceUpdateInterval: time.Duration(a.GetTraceUpdateInterval()) * time.Second}
	}
}

// end marks the stream ended: admits still awaiting their
// acknowledgement get ErrStreamEnded.
func (s *Stream) end() {
	s.endOnce.Do(func() {
		close(s.ended)
		s.mu.Lock()
		clear(s.waiting)
		s.mu.Unlock()
	})
}

func (s *Stream) send(m *pb.RunnerMessage) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	return s.call.Send(m)
}

// AckWait waits for the coordinator's answer to an admit that
// acknowledges its job. It fails with ErrStreamEnded when the stream ends
// first, or with ctx's error; either way the coordinator may have
// recorded the admit, and the runner acknowledges the job on REST to
// know.
type AckWait func(ctx context.Context) (Ack, error)

// Announce tells the coordinator the runner's capacity.
func (s *Stream) Announce(c Capacity) error {
	return s.send(&pb.RunnerMessage{Message: &pb.RunnerMessage_Capacity{Capacity: capacityToPB(c)}})
}

// Admit tells the coordinator the runner takes job id. On a stream that
// acknowledges (Acknowledges) the admit is the job's acknowledgement, and
// Admit returns the wait for the coordinator's answer; otherwise it
// returns nil and the runner acknowledges the job on REST, as any job.
func (s *Stream) Admit(id int64) (AckWait, error) {
	msg := &pb.RunnerMessage{Message: &pb.RunnerMessage_Answer{Answer: &pb.Answer{JobId: id}}}
	if !s.acks {
		return nil, s.send(msg)
	}
	ch := make(chan Ack, 1)
	s.mu.Lock()
	s.waiting[id] = ch
	s.mu.Unlock()
	if err := s.send(msg); err != nil {
		s.mu.Lock()
		delete(s.waiting, id)
		s.mu.Unlock()
		return nil, err
	}
	return func(ctx context.Context) (Ack, error) {
		select {
		case a := <-ch:
			return a, nil
		case <-s.ended:
			select {
			case a := <-ch: // it came with the stream's last messages
				return a, nil
			default:
			}
			return Ack{}, ErrStreamEnded
		case <-ctx.Done():
			return Ack{}, ctx.Err()
		}
	}, nil
}

// Reject gives job id back: code is codes.ResourceExhausted when the
// runner is full, another code (and msg) when it cannot take the job for
// another reason.
func (s *Stream) Reject(id int64, code codes.Code, msg string) error {
	if code == codes.OK {
		code = codes.ResourceExhausted
	}
	return s.send(&pb.RunnerMessage{Message: &pb.RunnerMessage_Answer{Answer: &pb.Answer{JobId: id, Code: uint32(code), Message: msg}}})
}

// Close ends the stream: jobs the runner did not answer go back to the
// queue. Safe to call more than once.
func (s *Stream) Close() error {
	s.end()
	s.cancel()
	return s.cc.Close()
}
