package guest

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/berthci/berth/guest/internal/pb"
)

// Dialer opens a byte stream to a VM's agent: the hypervisor's socket for
// the VM's agent port, directly or through an instance's connector.
type Dialer func(ctx context.Context) (net.Conn, error)

// maxMessage bounds one message either way (a script, stdin).
const maxMessage = 64 << 20

// Client is the host's side of one VM's agent. Safe for concurrent use:
// calls are multiplexed over the one stream.
type Client struct {
	cc *grpc.ClientConn
	c  pb.AgentClient
}

// NewClient returns a client that reaches the agent through dial. It does
// not connect yet; the first call does (and fails if the agent does not
// answer; Wait retries until it does).
func NewClient(dial Dialer) (*Client, error) {
	cc, err := grpc.NewClient("passthrough:///berth-agent",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return dial(ctx) }),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMessage), grpc.MaxCallSendMsgSize(maxMessage)),
		// The agent is never behind a proxy; its port is a byte stream.
		grpc.WithNoProxy(),
	)
	if err != nil {
		return nil, fmt.Errorf("guest agent client: %w", err)
	}
	return &Client{cc: cc, c: pb.NewAgentClient(cc)}, nil
}

// Close closes the client's connection.
func (c *Client) Close() error { return c.cc.Close() }

// Info is what the agent says of the guest.
type Info struct {
	Version  string
	Kernel   string
	Hostname string
	// Shells found in the job's root filesystem, of bash and sh, in that
	// order.
	Shells []string
	// Root is the root filesystem's device and type.
	Root string
	// Image is how the image says to run it.
	Image ImageConfig
}

func infoOf(r *pb.HelloResponse) Info {
	return Info{Version: r.GetVersion(), Kernel: r.GetKernel(), Hostname: r.GetHostname(), Shells: r.GetShells(), Root: r.GetRoot(),
		Image: ImageConfig{Env: r.GetImageEnv(), WorkingDir: r.GetImageWorkingDir(), User: r.GetImageUser()}}
}

// Hello says hello once, setting the guest's clock from the host's.
func (c *Client) Hello(ctx context.Context) (Info, error) {
	r, err := c.c.Hello(ctx, &pb.HelloRequest{UnixNanos: time.Now().UnixNano()})
	if err != nil {
		return Info{}, fmt.Errorf("guest agent: hello: %w", unwrap(err))
	}
	return infoOf(r), nil
}

// Wait says hello until the agent answers or ctx is done (a VM that is
// still booting has nobody on its port yet), retrying every interval.
func (c *Client) Wait(ctx context.Context, interval time.Duration) (Info, error) {
	var last error
	for {
		hctx, cancel := context.WithTimeout(ctx, interval+2*time.Second)
		info, err := c.c.Hello(hctx, &pb.HelloRequest{UnixNanos: time.Now().UnixNano()}, grpc.WaitForReady(true))
		cancel()
		if err == nil {
			return infoOf(info), nil
		}
		last = unwrap(err)
		select {
		case <-ctx.Done():
			return Info{}, fmt.Errorf("guest agent did not answer: %w (last: %v)", context.Cause(ctx), last)
		case <-time.After(interval):
		}
	}
}

// RunOptions are one command in the guest.
type RunOptions struct {
	// Argv is the command, in the job's root filesystem.
	Argv []string
	// Dir is its working directory; Env its whole environment.
	Dir string
	Env []string
	// Script, if ScriptPath is set, is written there (mode 0700) before
	// Argv runs and removed after.
	Script     string
	ScriptPath string
	// Grace is how long a canceled command gets between SIGTERM and
	// SIGKILL (0: DefaultGrace).
	Grace time.Duration
	// Stdin is given to the command.
	Stdin []byte
	// StdinStream, when set, is the command's standard input instead,
	// sent as it is read (an interactive shell): its end closes the
	// command's.
	StdinStream io.Reader
	// Detached runs are the executor's own: their end kills only their
	// process group, and a job script's end spares them.
	Detached bool
	// KeepProcesses: when a job script exits by itself, the processes it
	// started run on (the next script continues it); canceled, they go.
	KeepProcesses bool
	// Output receives stdout and stderr, in order, never concurrently.
	Output io.Writer
}

// ExitError is a command that ended with a non-zero status (128+n for a
// signal n).
type ExitError struct{ Code int }

func (e *ExitError) Error() string { return fmt.Sprintf("exit status %d", e.Code) }

// Run runs a command in the guest to its end. It returns nil on status 0,
// an *ExitError for any other status, and an error wrapping ErrCanceled
// and ctx's cause when ctx ended it (after the guest stopped every
// process of it); any other error is a failure to run it.
func (c *Client) Run(ctx context.Context, o RunOptions) error {
	if len(o.Argv) == 0 {
		return errors.New("guest run: no command")
	}
	// The stream outlives ctx: a cancel is a message, and the guest's
	// answer comes after it stopped the processes.
	sctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	defer stop()
	stream, err := c.c.Run(sctx)
	if err != nil {
		return fmt.Errorf("guest run: %w", unwrap(err))
	}
	grace := o.Grace
	if grace <= 0 {
		grace = DefaultGrace
	}
	start := &pb.RunStart{Argv: o.Argv, Dir: o.Dir, Env: o.Env, Script: o.Script, ScriptPath: o.ScriptPath,
		GraceMillis: grace.Milliseconds(), Stdin: o.Stdin, Detached: o.Detached, StdinStream: o.StdinStream != nil,
		KeepProcesses: o.KeepProcesses}
	if err := stream.Send(&pb.RunInput{Input: &pb.RunInput_Start{Start: start}}); err != nil {
		return fmt.Errorf("guest run: %w", unwrap(err))
	}
	var sendMu sync.Mutex
	if o.StdinStream != nil {
		go func() {
			buf := make([]byte, 32<<10)
			for {
				n, err := o.StdinStream.Read(buf)
				if n > 0 {
					sendMu.Lock()
					serr := stream.Send(&pb.RunInput{Input: &pb.RunInput_Stdin{Stdin: bytes.Clone(buf[:n])}})
					sendMu.Unlock()
					if serr != nil {
						return
					}
				}
				if err != nil {
					sendMu.Lock()
					_ = stream.Send(&pb.RunInput{Input: &pb.RunInput_Stdin{Stdin: []byte{}}})
					sendMu.Unlock()
					return
				}
			}
		}()
	}
	canceled := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
		case <-sctx.Done():
			return
		}
		close(canceled)
		sendMu.Lock()
		_ = stream.Send(&pb.RunInput{Input: &pb.RunInput_Cancel{Cancel: &pb.RunCancel{Reason: context.Cause(ctx).Error()}}})
		sendMu.Unlock()
		// A guest that does not answer within the grace period and a
		// margin is given up on.
		select {
		case <-time.After(grace + 30*time.Second):
			stop()
		case <-sctx.Done():
		}
	}()
	for {
		ev, err := stream.Recv()
		if err != nil {
			if isCanceled(canceled) {
				return fmt.Errorf("%w (the guest did not confirm: %v)", canceledErr(ctx), unwrap(err))
			}
			return fmt.Errorf("guest run: %w", unwrap(err))
		}
		switch e := ev.GetEvent().(type) {
		case *pb.RunEvent_Output:
			if o.Output != nil {
				_, _ = o.Output.Write(e.Output)
			}
		case *pb.RunEvent_Exit:
			sendMu.Lock()
			_ = stream.CloseSend()
			sendMu.Unlock()
			if isCanceled(canceled) {
				return canceledErr(ctx)
			}
			if e.Exit.GetCode() != 0 {
				return &ExitError{Code: int(e.Exit.GetCode())}
			}
			return nil
		case *pb.RunEvent_Failure:
			if e.Failure.GetKind() == pb.Failure_CANCELED && isCanceled(canceled) {
				return canceledErr(ctx)
			}
			return fmt.Errorf("guest run: %s", e.Failure.GetMessage())
		}
	}
}

// canceledErr is a run ended by ctx: it wraps ErrCanceled, ctx's error
// and its cause.
func canceledErr(ctx context.Context) error {
	if cause := context.Cause(ctx); cause != nil && cause != ctx.Err() {
		return fmt.Errorf("%w: %w: %w", ErrCanceled, ctx.Err(), cause)
	}
	return fmt.Errorf("%w: %w", ErrCanceled, ctx.Err())
}

func isCanceled(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// Expose makes guestAddr (host:port inside the guest) lead to what dial
// connects to on the host's side, until ctx ends or stop is called. It
// returns once the guest listens.
func (c *Client) Expose(ctx context.Context, guestAddr string, dial func(ctx context.Context) (net.Conn, error)) (stop func(), err error) {
	lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stream, err := c.c.Listen(lctx, &pb.ListenRequest{Addr: guestAddr})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("guest listen on %s: %w", guestAddr, unwrap(err))
	}
	// The first Accepted says it listens; an error comes instead.
	if _, err := stream.Recv(); err != nil {
		cancel()
		return nil, fmt.Errorf("guest listen on %s: %w", guestAddr, unwrap(err))
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			a, err := stream.Recv()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				c.tunnel(lctx, a.GetId(), dial)
			}()
		}
	}()
	return func() {
		cancel()
		wg.Wait()
	}, nil
}

// tunnel carries connection id of the guest to a new connection from dial.
func (c *Client) tunnel(ctx context.Context, id uint64, dial func(ctx context.Context) (net.Conn, error)) {
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	t, err := dial(dctx)
	cancel()
	if err != nil {
		// Opening the tunnel and closing it at once closes the guest's
		// connection: the job sees a refused or reset connection.
		if s, serr := c.c.Tunnel(ctx); serr == nil {
			_ = s.Send(&pb.Chunk{Id: id})
			_ = s.CloseSend()
			for {
				if _, err := s.Recv(); err != nil {
					break
				}
			}
		}
		return
	}
	defer t.Close()
	s, err := c.c.Tunnel(ctx)
	if err != nil {
		return
	}
	if err := s.Send(&pb.Chunk{Id: id}); err != nil {
		return
	}
	_ = pump(t, clientChunks{s})
}

// clientChunks makes a client Tunnel stream a chunkStream whose half-close
// is CloseSend.
type clientChunks struct {
	grpc.BidiStreamingClient[pb.Chunk, pb.Chunk]
}

func (s clientChunks) Send(c *pb.Chunk) error {
	if len(c.GetData()) == 0 {
		return s.CloseSend()
	}
	return s.BidiStreamingClient.Send(c)
}

// Poweroff asks the guest to power off.
func (c *Client) Poweroff(ctx context.Context) error {
	if _, err := c.c.Poweroff(ctx, &pb.PoweroffRequest{}); err != nil {
		return fmt.Errorf("guest poweroff: %w", unwrap(err))
	}
	return nil
}

// unwrap turns a gRPC status into a plain error with its message.
func unwrap(err error) error {
	if s, ok := status.FromError(err); ok && s.Code() != codes.Unknown {
		return fmt.Errorf("%s (%s)", s.Message(), s.Code())
	} else if ok {
		return errors.New(s.Message())
	}
	return err
}

// Restored tells a guest restored from a snapshot its host name and the
// time, and gives it fresh entropy (from crypto/rand). Call it before
// anything else on a restored VM.
func (c *Client) Restored(ctx context.Context, hostname string) error {
	seed := make([]byte, 64)
	if _, err := rand.Read(seed); err != nil {
		return fmt.Errorf("guest agent: restored: %w", err)
	}
	if _, err := c.c.Restored(ctx, &pb.RestoredRequest{Hostname: hostname, Seed: seed, UnixNanos: time.Now().UnixNano()}, grpc.WaitForReady(true)); err != nil {
		return fmt.Errorf("guest agent: restored: %w", unwrap(err))
	}
	return nil
}
