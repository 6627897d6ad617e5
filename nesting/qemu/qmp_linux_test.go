package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestQMP: against a monitor speaking QMP on a socket — greeting,
// capabilities, an event between commands, a return, an error.
func TestQMP(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "qmp.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.Write([]byte(`{"QMP": {"version": {}, "capabilities": []}}` + "\n"))
		dec := json.NewDecoder(c) // QEMU reads a stream of JSON values, not lines
		for {
			var cmd struct{ Execute string }
			if dec.Decode(&cmd) != nil {
				return
			}
			switch cmd.Execute {
			case "qmp_capabilities":
				c.Write([]byte(`{"return": {}}` + "\n"))
			case "query-status":
				c.Write([]byte(`{"event": "VSERPORT_CHANGE", "data": {"id": "agentport", "open": true}}` + "\n" +
					`{"return": {"status": "running"}}` + "\n"))
			default:
				c.Write([]byte(`{"error": {"class": "CommandNotFound", "desc": "The command ` + cmd.Execute + ` has not been found"}}` + "\n"))
			}
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	q, err := dialQMP(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	ret, err := q.execute(ctx, "query-status", nil)
	if err != nil || !strings.Contains(string(ret), `"running"`) {
		t.Fatalf("query-status = %s, %v", ret, err)
	}
	if err := q.waitEvent(ctx, "VSERPORT_CHANGE", portOpen(true)); err != nil {
		t.Errorf("the event sent before the return: %v", err)
	}
	var qe *qmpError
	if _, err := q.execute(ctx, "bogus", nil); !errors.As(err, &qe) || qe.Class != "CommandNotFound" {
		t.Errorf("bogus = %v, want a QMP CommandNotFound error", err)
	}
}
