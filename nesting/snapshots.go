package nesting

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berthci/berth/nesting/internal/pb"
)

// ErrNoSnapshots is a daemon that cannot snapshot VMs: GitLab's, or one
// whose hypervisor is no Snapshotter.
var ErrNoSnapshots = errors.New("this nesting daemon cannot snapshot VMs")

// snapshotChunk is the size of the stream's messages.
const snapshotChunk = 1 << 20

// snapshotServer serves Berth's Snapshots service for a hypervisor that
// is a Snapshotter.
type snapshotServer struct {
	pb.UnimplementedSnapshotsServer
	sn Snapshotter
}

func (s *snapshotServer) SnapshotVM(req *pb.SnapshotVMRequest, stream grpc.ServerStreamingServer[pb.SnapshotChunk]) error {
	var job SnapshotJob
	if len(req.GetJob()) > 0 {
		if err := json.Unmarshal(req.GetJob(), &job); err != nil {
			return status.Errorf(codes.InvalidArgument, "job: %v", err)
		}
	}
	w := &chunkWriter{send: func(b []byte) error { return stream.Send(&pb.SnapshotChunk{Data: b}) }}
	if err := s.sn.SnapshotVM(stream.Context(), req.GetId(), job, w); err != nil {
		return toStatus(err)
	}
	return w.flush()
}

// chunkWriter sends what is written in messages of snapshotChunk bytes.
type chunkWriter struct {
	buf  []byte
	send func([]byte) error
}

func (w *chunkWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		k := min(len(p), snapshotChunk-len(w.buf))
		w.buf = append(w.buf, p[:k]...)
		p = p[k:]
		if len(w.buf) == snapshotChunk {
			if err := w.flush(); err != nil {
				return n - len(p), err
			}
		}
	}
	return n, nil
}

func (w *chunkWriter) flush() error {
	if len(w.buf) == 0 {
		return nil
	}
	err := w.send(w.buf)
	w.buf = make([]byte, 0, snapshotChunk)
	return err
}

// SnapshotVM asks the daemon for VM id's snapshot bundle and writes it to
// w (Berth's extension: ErrNoSnapshots from a daemon without it; an
// unknown id wraps ErrNotFound).
func (c *Client) SnapshotVM(ctx context.Context, id string, job SnapshotJob, w io.Writer) error {
	b, err := json.Marshal(job)
	if err != nil {
		return err
	}
	stream, err := pb.NewSnapshotsClient(c.conn).SnapshotVM(ctx, &pb.SnapshotVMRequest{Id: id, Job: b})
	if err != nil {
		return c.snapshotErr(ctx, err)
	}
	for {
		chunk, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return c.snapshotErr(ctx, err)
		}
		if _, err := w.Write(chunk.GetData()); err != nil {
			return fmt.Errorf("snapshot of VM %s: %w", id, err)
		}
	}
}

func (c *Client) snapshotErr(ctx context.Context, err error) error {
	if status.Code(err) == codes.Unimplemented {
		return fmt.Errorf("%w (%s)", ErrNoSnapshots, c.target)
	}
	return fmt.Errorf("snapshot: %w", fromStatus(ctx, err))
}
