//go:build !linux

package ssh

import "net"

// quickAck is a no-op where TCP_QUICKACK does not exist.
func quickAck(c net.Conn) net.Conn { return c }
