package ssh

import (
	"net"
	"syscall"
)

// quickAck turns off delayed acknowledgements on a TCP connection to the
// host. sshd leaves Nagle's algorithm on for sessions without a
// terminal, so a reply it writes while an earlier small packet is still
// unacknowledged waits for our ACK, which Linux delays by 40 ms when we
// have nothing to send: every job would pay that on its first request,
// and stages on their small exchanges. TCP_QUICKACK is not sticky (the
// kernel may fall back to delayed ACKs), so it is set again after every
// read; that costs one setsockopt per read.
func quickAck(c net.Conn) net.Conn {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return c
	}
	q := &quickAckConn{TCPConn: tc, raw: raw}
	q.set()
	return q
}

type quickAckConn struct {
	*net.TCPConn
	raw syscall.RawConn
}

func (q *quickAckConn) Read(p []byte) (int, error) {
	n, err := q.TCPConn.Read(p)
	q.set()
	return n, err
}

func (q *quickAckConn) set() {
	_ = q.raw.Control(func(fd uintptr) {
		_ = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_QUICKACK, 1)
	})
}
