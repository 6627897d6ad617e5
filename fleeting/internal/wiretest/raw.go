package wiretest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
)

// Raw plugin answers, so a test can check that each field arrived where the
// reference puts it.
const (
	RawMaxSize    = 7
	RawExpires    = 1900000000
	RawLogMessage = "raw plugin started"
)

// ServeRawPlugin is a fleeting plugin written from the reference alone:
// it checks the magic cookie, listens on a unix socket, prints the
// handshake line "1|0|unix|<socket>|grpc|", serves proto.InstanceGroup with
// dynamic messages plus the gRPC health service, logs one hclog JSON line to
// stderr and exits when go-plugin's controller asks it to. It does not
// implement Heartbeat, as older upstream plugins do not. It never returns.
//
// Its answers echo its inputs:
//   - Init: id "raw:<config JSON>", version "<username>|<protocol>|<keepalive ns>|<key>|<useStaticCredentials>|<protocol_port>", max_size RawMaxSize;
//   - Update: one instance per state, named "i-<state>", in enum order;
//   - Increase: n-1 succeeded;
//   - Decrease: the ids reversed;
//   - ConnectInfo: NotFound for "missing", else fixed values with username = the instance ID.
func ServeRawPlugin() {
	if os.Getenv(CookieKey) != CookieValue {
		fmt.Fprintln(os.Stderr, "not started as a fleeting plugin")
		os.Exit(1)
	}
	dir, err := os.MkdirTemp("", "rawplugin")
	if err != nil {
		fail(err)
	}
	sock := filepath.Join(dir, "plugin.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		fail(err)
	}
	s := grpc.NewServer()
	hs := health.NewServer()
	hs.SetServingStatus("plugin", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(s, hs)
	s.RegisterService(rawServiceDesc(), struct{}{})
	s.RegisterService(&grpc.ServiceDesc{
		ServiceName: "plugin.GRPCController",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{MethodName: "Shutdown", Handler: func(_ any, _ context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			in := New("Empty")
			if err := dec(in); err != nil {
				return nil, err
			}
			go func() {
				time.Sleep(50 * time.Millisecond)
				os.RemoveAll(dir)
				os.Exit(0)
			}()
			return New("Empty"), nil
		}}},
	}, struct{}{})
	fmt.Fprintf(os.Stderr, `{"@level":"warn","@message":%q,"@timestamp":%q,"answer":42}`+"\n",
		RawLogMessage, time.Now().Format("2006-01-02T15:04:05.000000Z07:00"))
	fmt.Fprintf(os.Stdout, "1|0|unix|%s|grpc|\n", sock)
	if err := s.Serve(l); err != nil {
		fail(err)
	}
	os.Exit(0)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "raw plugin:", err)
	os.Exit(1)
}

func unary(in, out string, fn func(req, resp *dynamicpb.Message) error) grpc.MethodHandler {
	return func(_ any, _ context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
		req := New(in)
		if err := dec(req); err != nil {
			return nil, err
		}
		resp := New(out)
		if err := fn(req, resp); err != nil {
			return nil, err
		}
		return resp, nil
	}
}

func rawServiceDesc() *grpc.ServiceDesc {
	return &grpc.ServiceDesc{
		ServiceName: Service,
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{
			{MethodName: "Init", Handler: unary("InitRequest", "InitResponse", func(req, resp *dynamicpb.Message) error {
				cc := Get(Get(req, "settings").(*dynamicpb.Message), "connector_config").(*dynamicpb.Message)
				Set(resp, "id", "raw:"+string(Get(req, "config").([]byte)))
				Set(resp, "max_size", uint32(RawMaxSize))
				Set(resp, "version", strings.Join([]string{
					Get(cc, "username").(string),
					Get(cc, "protocol").(string),
					strconv.FormatInt(Get(cc, "keepalive").(int64), 10),
					string(Get(cc, "key").([]byte)),
					strconv.FormatBool(Get(cc, "useStaticCredentials").(bool)),
					strconv.FormatInt(Get(cc, "protocol_port").(int64), 10),
				}, "|"))
				Set(resp, "build_info", "raw")
				return nil
			})},
			{MethodName: "Increase", Handler: unary("IncreaseRequest", "IncreaseResponse", func(req, resp *dynamicpb.Message) error {
				Set(resp, "succeeded", Get(req, "n").(uint32)-1)
				return nil
			})},
			{MethodName: "Decrease", Handler: unary("DecreaseRequest", "DecreaseResponse", func(req, resp *dynamicpb.Message) error {
				ids := Get(req, "instances").([]string)
				slices.Reverse(ids)
				Set(resp, "succeeded", ids)
				return nil
			})},
			{MethodName: "ConnectInfo", Handler: unary("ConnectInfoRequest", "ConnectInfoResponse", func(req, resp *dynamicpb.Message) error {
				id := Get(req, "instance").(string)
				if id == "missing" {
					return status.Error(codes.NotFound, "no instance missing")
				}
				cc := New("ConnectorConfig")
				Set(cc, "os", "linux")
				Set(cc, "arch", "arm64")
				Set(cc, "protocol", "ssh")
				Set(cc, "username", id)
				Set(cc, "password", "pw")
				Set(cc, "key", []byte("KEY"))
				Set(cc, "useStaticCredentials", true)
				Set(cc, "keepalive", int64(5*time.Second))
				Set(cc, "timeout", int64(7*time.Second))
				Set(cc, "protocol_port", int64(2222))
				Set(resp, "connector", cc)
				Set(resp, "ExternalAddr", "203.0.113.1")
				Set(resp, "InternalAddr", "10.0.0.1")
				Set(resp, "expires", int64(RawExpires))
				return nil
			})},
			{MethodName: "Shutdown", Handler: unary("Empty", "Empty", func(_, _ *dynamicpb.Message) error { return nil })},
		},
		Streams: []grpc.StreamDesc{{
			StreamName:    "Update",
			ServerStreams: true,
			Handler: func(_ any, stream grpc.ServerStream) error {
				if err := stream.RecvMsg(New("Empty")); err != nil {
					return err
				}
				for i, st := range StateValues {
					m := New("UpdateResponse")
					Set(m, "instance", "i-"+st)
					Set(m, "state", protoreflect.EnumNumber(i))
					if err := stream.SendMsg(m); err != nil {
						return err
					}
				}
				return nil
			},
		}},
	}
}

// RawHost starts and drives a plugin binary the way the reference says a
// host does, with no go-plugin client.
type RawHost struct {
	cmd *exec.Cmd
	// Handshake is the line the plugin printed.
	Handshake string
	Conn      *grpc.ClientConn
	exited    chan struct{}
}

// StartRaw starts the plugin at path with no arguments and the magic cookie
// in its environment, reads the handshake line and dials the socket in it.
func StartRaw(ctx context.Context, path string, stderr io.Writer) (*RawHost, error) {
	cmd := exec.Command(path)
	cmd.Env = append(os.Environ(), CookieKey+"="+CookieValue)
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	h := &RawHost{cmd: cmd, exited: make(chan struct{})}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		if sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		io.Copy(io.Discard, out)
	}()
	go func() { cmd.Wait(); close(h.exited) }()
	select {
	case line, ok := <-lines:
		if !ok {
			h.Close()
			return nil, errors.New("plugin exited without a handshake line")
		}
		h.Handshake = line
	case <-ctx.Done():
		h.Close()
		return nil, ctx.Err()
	}
	parts := strings.Split(h.Handshake, "|")
	if len(parts) < 5 || parts[2] != "unix" {
		h.Close()
		return nil, fmt.Errorf("unexpected handshake line %q", h.Handshake)
	}
	conn, err := grpc.NewClient("unix:"+parts[3], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		h.Close()
		return nil, err
	}
	h.Conn = conn
	return h, nil
}

// Call invokes a unary method of proto.InstanceGroup.
func (h *RawHost) Call(ctx context.Context, method string, req *dynamicpb.Message, out string) (*dynamicpb.Message, error) {
	resp := New(out)
	err := h.Conn.Invoke(ctx, "/"+Service+"/"+method, req, resp)
	return resp, err
}

// Update calls the streaming Update and collects every response.
func (h *RawHost) Update(ctx context.Context) ([]*dynamicpb.Message, error) {
	s, err := h.Conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, "/"+Service+"/Update")
	if err != nil {
		return nil, err
	}
	if err := s.SendMsg(New("Empty")); err != nil {
		return nil, err
	}
	if err := s.CloseSend(); err != nil {
		return nil, err
	}
	var out []*dynamicpb.Message
	for {
		m := New("UpdateResponse")
		err := s.RecvMsg(m)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, m)
	}
}

// Exited is closed when the plugin process has exited.
func (h *RawHost) Exited() <-chan struct{} { return h.exited }

// Close kills the plugin.
func (h *RawHost) Close() {
	if h.Conn != nil {
		h.Conn.Close()
	}
	h.cmd.Process.Kill()
	<-h.exited
}
