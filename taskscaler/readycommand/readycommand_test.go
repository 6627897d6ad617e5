package readycommand

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/berthci/berth/fleeting"
	"github.com/berthci/berth/fleeting/connector"
)

// sshd is a tiny SSH server: "exit N" exits with N after printing the
// command; anything else exits 0.
func sshd(t *testing.T) (addr string, commands func() []string) {
	t.Helper()
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &ssh.ServerConfig{PasswordCallback: func(c ssh.ConnMetadata, pw []byte) (*ssh.Permissions, error) {
		if string(pw) == "secret" {
			return nil, nil
		}
		return nil, errors.New("denied")
	}}
	cfg.AddHostKey(signer)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	var mu sync.Mutex
	var got []string
	go func() {
		for {
			nc, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer nc.Close()
				_, chans, reqs, err := ssh.NewServerConn(nc, cfg)
				if err != nil {
					return
				}
				go ssh.DiscardRequests(reqs)
				for nch := range chans {
					ch, creqs, err := nch.Accept()
					if err != nil {
						return
					}
					go func() {
						defer ch.Close()
						for req := range creqs {
							if req.Type != "exec" {
								req.Reply(false, nil)
								continue
							}
							cmd := string(req.Payload[4:])
							mu.Lock()
							got = append(got, cmd)
							mu.Unlock()
							req.Reply(true, nil)
							code := uint32(0)
							if strings.HasPrefix(cmd, "exit 3") {
								code = 3
								ch.Stderr().Write([]byte("not ready yet\n"))
							}
							status := make([]byte, 4)
							binary.BigEndian.PutUint32(status, code)
							ch.SendRequest("exit-status", false, status)
							return
						}
					}()
				}
			}()
		}
	}()
	return l.Addr().String(), func() []string { mu.Lock(); defer mu.Unlock(); return append([]string(nil), got...) }
}

func TestReady(t *testing.T) {
	addr, commands := sshd(t)
	info := fleeting.ConnectInfo{ID: "i-1", InternalAddr: addr,
		ConnectorConfig: fleeting.ConnectorConfig{Username: "ci", Password: "secret", Timeout: 5 * time.Second}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	r := &Readier{Command: "cloud-init status --wait"}
	if err := r.Ready(ctx, info); err != nil {
		t.Fatal(err)
	}
	if got := commands(); len(got) != 1 || got[0] != "cloud-init status --wait" {
		t.Fatalf("commands run: %q", got)
	}

	r.Command = "exit 3"
	err := r.Ready(ctx, info)
	var exit *connector.ExitError
	if !errors.As(err, &exit) || exit.Code != 3 || !strings.Contains(err.Error(), "not ready yet") || !strings.Contains(err.Error(), "i-1") {
		t.Fatalf("failing command: %v", err)
	}

	// No command: connecting is the check.
	if err := (&Readier{}).Ready(ctx, info); err != nil {
		t.Fatal(err)
	}
	bad := info
	bad.Password = "wrong"
	if err := (&Readier{Command: "true"}).Ready(ctx, bad); err == nil {
		t.Fatal("ready with bad credentials")
	}
}
