package sdk

import (
	"context"
	"io"
	"log/slog"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/executor/plugin/internal/pb"
)

// serve serves newServer over an in-memory gRPC connection.
func serveForTest(t *testing.T, newProvider func(context.Context, Setup) (executor.Provider, error)) pb.ExecutorClient {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	s := grpc.NewServer()
	pb.RegisterExecutorServer(s, newServer(Options{Name: "t", New: newProvider}, slog.New(slog.DiscardHandler)))
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	conn, err := grpc.NewClient("passthrough:///buf", grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
		return lis.DialContext(ctx)
	}), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pb.NewExecutorClient(conn)
}

type nopProvider struct{}

func (nopProvider) Create(context.Context) (executor.Executor, error) { return nil, io.EOF }

func TestServerRefusesMisuse(t *testing.T) {
	ctx := t.Context()
	c := serveForTest(t, func(context.Context, Setup) (executor.Provider, error) { return nopProvider{}, nil })
	if r, err := c.Create(ctx, &pb.CreateRequest{}); err != nil || r.GetFailure() == nil {
		t.Fatalf("Create before Describe: %v %v, want a failure", r, err)
	}
	if r, err := c.Describe(ctx, &pb.DescribeRequest{Config: []byte(`[1,2]`)}); err != nil || r.GetFailure().GetKind() != pb.Failure_CONFIG {
		t.Fatalf("Describe with an array: %v %v, want a CONFIG failure", r, err)
	}
	if r, err := c.Describe(ctx, &pb.DescribeRequest{Config: []byte(`{"a":1}`)}); err != nil || r.GetFailure() != nil {
		t.Fatalf("Describe: %v %v", r, err)
	}
	if r, err := c.Describe(ctx, &pb.DescribeRequest{Config: []byte(`{"a":2}`)}); err != nil || r.GetFailure().GetKind() != pb.Failure_CONFIG {
		t.Fatalf("Describe with another configuration: %v %v, want a CONFIG failure", r, err)
	}
	if r, err := c.Describe(ctx, &pb.DescribeRequest{Config: []byte(`{"a":1}`)}); err != nil || r.GetFailure() != nil {
		t.Fatalf("Describe again with the same configuration (a restart's replay): %v %v", r, err)
	}
	stream, err := c.Run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stream.Send(&pb.RunInput{Input: &pb.RunInput_Cancel{Cancel: &pb.RunCancel{}}})
	ev, err := stream.Recv()
	if err != nil || ev.GetFailure() == nil {
		t.Fatalf("Run starting with cancel: %v %v, want a failure", ev, err)
	}
	stream, _ = c.Run(ctx)
	stream.Send(&pb.RunInput{Input: &pb.RunInput_Start{Start: &pb.RunStart{ExecutorId: "nope", Stage: "step_script"}}})
	if ev, err := stream.Recv(); err != nil || ev.GetFailure().GetKind() != pb.Failure_NOT_PREPARED {
		t.Fatalf("Run of an unknown executor: %v %v, want NOT_PREPARED", ev, err)
	}
	if r, err := c.Cleanup(ctx, &pb.CleanupRequest{ExecutorId: "nope"}); err != nil || r.GetFailure() != nil {
		t.Fatalf("Cleanup of an unknown executor: %v %v, want success (idempotent)", r, err)
	}
	if r, err := c.Create(ctx, &pb.CreateRequest{}); err != nil || r.GetFailure() == nil {
		t.Fatalf("Create whose provider fails: %v %v, want a failure", r, err)
	}
}
