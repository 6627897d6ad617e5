package nesting

import (
	"path/filepath"
	"testing"
)

func TestParseTarget(t *testing.T) {
	t.Setenv("NESTING_SOCKET", "/run/berth/nesting.sock")
	tests := []struct {
		target, network, addr string
		wantErr               bool
	}{
		{target: "", network: "unix", addr: "/run/berth/nesting.sock"},
		{target: "unix:///run/nesting.sock", network: "unix", addr: "/run/nesting.sock"},
		{target: "unix:///Users/ec2-user/Library/Application Support/nesting.sock", network: "unix", addr: "/Users/ec2-user/Library/Application Support/nesting.sock"},
		{target: "unix:/run/nesting.sock", network: "unix", addr: "/run/nesting.sock"},
		{target: "unix:nesting.sock", network: "unix", addr: "nesting.sock"},
		{target: "unix:run/../nesting.sock", network: "unix", addr: "nesting.sock"},
		{target: "/run/nesting.sock", network: "unix", addr: "/run/nesting.sock"},
		{target: "tcp://127.0.0.1:7000", network: "tcp", addr: "127.0.0.1:7000"},
		{target: "tcp:127.0.0.1:7000", network: "tcp", addr: "127.0.0.1:7000"},
		{target: "tcp6://[::1]:7000", network: "tcp6", addr: "[::1]:7000"},
		{target: "tcp4:10.0.0.2:7000", network: "tcp4", addr: "10.0.0.2:7000"},
		{target: "dns:///nesting.example:7000", network: "tcp", addr: "nesting.example:7000"},
		{target: "dns://8.8.8.8/nesting.example:7000", network: "tcp", addr: "nesting.example:7000"},
		{target: "localhost:7000", network: "tcp", addr: "localhost:7000"},
		{target: "[::1]:7000", network: "tcp", addr: "[::1]:7000"},
		{target: "unix://relative.sock", wantErr: true},
		{target: "unix:", wantErr: true},
		{target: "unix://", wantErr: true},
		{target: "tcp://nohost", wantErr: true},
		{target: "tcp:", wantErr: true},
		{target: "nesting.sock", wantErr: true},
		{target: "http://x:1/", wantErr: true},
	}
	for _, tt := range tests {
		network, addr, err := ParseTarget(tt.target)
		if tt.wantErr {
			if err == nil {
				t.Errorf("ParseTarget(%q) = %s %s, want an error", tt.target, network, addr)
			}
			continue
		}
		if err != nil || network != tt.network || addr != tt.addr {
			t.Errorf("ParseTarget(%q) = %q %q %v, want %q %q", tt.target, network, addr, err, tt.network, tt.addr)
		}
	}
}

func FuzzParseTarget(f *testing.F) {
	for _, s := range []string{"", "unix:///a", "unix:a", "tcp://h:1", "h:1", "dns:///h:1", "/a", "unix://"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, target string) {
		network, addr, err := ParseTarget(target)
		if err != nil {
			return
		}
		switch network {
		case "unix", "tcp", "tcp4", "tcp6":
		default:
			t.Fatalf("ParseTarget(%q) gave network %q", target, network)
		}
		if addr == "" {
			t.Fatalf("ParseTarget(%q) gave an empty address", target)
		}
	})
}

func TestDefaultSocket(t *testing.T) {
	// The rules on this system (Linux and other Unix), through the
	// environment.
	tests := []struct {
		name                     string
		nestingSocket, xdg, home string
		want                     string
	}{
		{"NESTING_SOCKET wins", "/srv/n.sock", "/run/user/1000", "/home/u", "/srv/n.sock"},
		{"XDG_RUNTIME_DIR", "", "/run/user/1000", "/home/u", "/run/user/1000/nesting.sock"},
		{"home when XDG_RUNTIME_DIR is empty", "", "", "/home/u", "/home/u/nesting.sock"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("NESTING_SOCKET", tt.nestingSocket)
			t.Setenv("XDG_RUNTIME_DIR", tt.xdg)
			t.Setenv("HOME", tt.home)
			if got := DefaultSocket(); got != filepath.FromSlash(tt.want) {
				t.Errorf("DefaultSocket() = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestDefaultSocketByOS(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	tests := []struct {
		goos string
		env  map[string]string
		home string
		want string
	}{
		{"linux", map[string]string{"NESTING_SOCKET": "/x.sock", "XDG_RUNTIME_DIR": "/run/user/1"}, "/home/u", "/x.sock"},
		{"linux", map[string]string{"XDG_RUNTIME_DIR": "/run/user/1"}, "/home/u", "/run/user/1/nesting.sock"},
		{"linux", nil, "/home/u", "/home/u/nesting.sock"},
		{"freebsd", map[string]string{"XDG_RUNTIME_DIR": "/var/run/user/1"}, "/home/u", "/var/run/user/1/nesting.sock"},
		{"darwin", map[string]string{"XDG_RUNTIME_DIR": "/ignored"}, "/Users/u", "/Users/u/Library/Application Support/nesting.sock"},
		{"darwin", map[string]string{"NESTING_SOCKET": "/tmp/n.sock"}, "/Users/u", "/tmp/n.sock"},
		{"windows", map[string]string{"LOCALAPPDATA": "/AppData/Local"}, "/Users/u", "/AppData/Local/nesting.sock"},
		{"windows", nil, "/Users/u", "/Users/u/nesting.sock"},
	}
	for _, tt := range tests {
		if got := defaultSocket(tt.goos, env(tt.env), tt.home); got != filepath.FromSlash(tt.want) {
			t.Errorf("%s %v home %s: defaultSocket = %q, want %q", tt.goos, tt.env, tt.home, got, tt.want)
		}
	}
}
