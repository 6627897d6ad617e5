package guest

import (
	"bytes"
	"io"
	"net"

	"github.com/berthci/berth/guest/internal/pb"
)

// chunkStream is either end of a Tunnel.
type chunkStream interface {
	Send(*pb.Chunk) error
	Recv() (*pb.Chunk, error)
}

// pump copies between a connection and a tunnel until both directions
// ended: an empty chunk is the end of the sender's data (its half-close),
// and the stream's end is the end of the other side's.
func pump(c net.Conn, s chunkStream) error {
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, 32<<10)
		for {
			n, err := c.Read(buf)
			if n > 0 {
				if serr := s.Send(&pb.Chunk{Data: bytes.Clone(buf[:n])}); serr != nil {
					done <- serr
					return
				}
			}
			if err != nil {
				done <- s.Send(&pb.Chunk{})
				return
			}
		}
	}()
	for {
		in, err := s.Recv()
		if err == io.EOF || err == nil && len(in.GetData()) == 0 {
			closeWrite(c)
			break
		}
		if err != nil {
			c.Close()
			break
		}
		if _, err := c.Write(in.GetData()); err != nil {
			c.Close()
			break
		}
	}
	return <-done
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		return
	}
	_ = c.Close()
}
