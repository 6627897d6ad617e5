package sshserver_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"net"
	"testing"

	"golang.org/x/crypto/ssh"

	"github.com/berthci/berth/fleeting/internal/sshserver"
)

func signer(t *testing.T) ssh.Signer {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func serve(t *testing.T, srv *sshserver.Server) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve = %v", err)
		}
	})
	return l.Addr().String()
}

func TestAuthAndRefusals(t *testing.T) {
	client := signer(t)
	addr := serve(t, &sshserver.Server{HostKey: signer(t), AuthorizedKeys: []ssh.PublicKey{client.PublicKey()}, Username: "ci", Password: "pw"})
	cfg := func(user string, auth ...ssh.AuthMethod) *ssh.ClientConfig {
		return &ssh.ClientConfig{User: user, Auth: auth, HostKeyCallback: ssh.InsecureIgnoreHostKey()}
	}
	for name, c := range map[string]*ssh.ClientConfig{
		"unknown key":    cfg("ci", ssh.PublicKeys(signer(t))),
		"wrong user":     cfg("root", ssh.PublicKeys(client)),
		"wrong password": cfg("ci", ssh.Password("nope")),
	} {
		if conn, err := ssh.Dial("tcp", addr, c); err == nil {
			conn.Close()
			t.Errorf("%s: login succeeded", name)
		}
	}
	for name, c := range map[string]*ssh.ClientConfig{
		"key":      cfg("ci", ssh.PublicKeys(client)),
		"password": cfg("ci", ssh.Password("pw")),
	} {
		conn, err := ssh.Dial("tcp", addr, c)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		s, err := conn.NewSession()
		if err != nil {
			t.Fatal(err)
		}
		if err := s.RequestPty("xterm", 24, 80, nil); err == nil {
			t.Errorf("%s: a pty was granted; the server has none", name)
		}
		if out, err := s.Output("echo $X"); err != nil || string(out) != "\n" {
			t.Errorf("%s: exec = %q, %v", name, out, err)
		}
		if _, _, err := conn.OpenChannel("x11", nil); err == nil {
			t.Errorf("%s: unknown channel type accepted", name)
		}
		if ok, _, err := conn.SendRequest("keepalive@openssh.com", true, nil); err != nil || ok {
			t.Errorf("%s: keepalive got %v, %v; want a refusal (a reply)", name, ok, err)
		}
		conn.Close()
	}
}

func TestNoHostKey(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := (&sshserver.Server{}).Serve(context.Background(), l); err == nil {
		t.Fatal("Serve without a host key succeeded")
	}
}
