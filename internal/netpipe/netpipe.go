// Package netpipe joins two byte streams: what a port forward, a tunnel
// or a multiplexed stream does with a client's connection.
package netpipe

import (
	"context"
	"io"
	"sync"
)

type closeWriter interface{ CloseWrite() error }

// Join copies both ways between a and b, half-closing each direction when
// its source ends (CloseWrite where the destination has it, else Close:
// a yamux stream's or an SSH channel's Close is a half close of its own).
// It returns once both directions are done, closing a and b; when ctx
// ends first, both are closed at once, which ends the copies.
func Join(ctx context.Context, a, b io.ReadWriteCloser) {
	var wg sync.WaitGroup
	cp := func(dst, src io.ReadWriteCloser) {
		defer wg.Done()
		io.Copy(dst, src)
		if cw, ok := dst.(closeWriter); ok {
			cw.CloseWrite()
		} else {
			dst.Close()
		}
	}
	wg.Add(2)
	go cp(a, b)
	go cp(b, a)
	stop := context.AfterFunc(ctx, func() { a.Close(); b.Close() })
	wg.Wait()
	stop()
	a.Close()
	b.Close()
}
