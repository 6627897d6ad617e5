package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// qmp is a QEMU Machine Protocol connection (QEMU's -qmp socket): JSON
// commands, one at a time, and the events QEMU sends meanwhile.
type qmp struct {
	conn net.Conn
	// replies carries each command's answer; events every event, until
	// the connection ends (both are then closed).
	replies chan qmpMessage
	events  chan qmpEvent
	mu      sync.Mutex // one command at a time
	done    chan struct{}
	err     error // why the connection ended; set before done closes
}

type qmpMessage struct {
	Return json.RawMessage `json:"return"`
	Error  *struct {
		Class string `json:"class"`
		Desc  string `json:"desc"`
	} `json:"error"`
	Event    string          `json:"event"`
	Data     json.RawMessage `json:"data"`
	Greeting json.RawMessage `json:"QMP"`
}

type qmpEvent struct {
	Name string
	Data json.RawMessage
}

// dialQMP connects to a QMP socket (retrying until QEMU made it or ctx
// ends), reads the greeting and leaves capabilities negotiation.
func dialQMP(ctx context.Context, path string) (*qmp, error) {
	var conn net.Conn
	for {
		var d net.Dialer
		c, err := d.DialContext(ctx, "unix", path)
		if err == nil {
			conn = c
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("connecting to QMP: %w", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	q := &qmp{conn: conn, replies: make(chan qmpMessage, 1), events: make(chan qmpEvent, 64), done: make(chan struct{})}
	greeting := make(chan error, 1)
	go q.read(greeting)
	select {
	case err := <-greeting:
		if err != nil {
			conn.Close()
			return nil, err
		}
	case <-ctx.Done():
		conn.Close()
		return nil, fmt.Errorf("QMP greeting: %w", ctx.Err())
	}
	if _, err := q.execute(ctx, "qmp_capabilities", nil); err != nil {
		q.Close()
		return nil, err
	}
	return q, nil
}

func (q *qmp) read(greeting chan<- error) {
	dec := json.NewDecoder(q.conn)
	first := true
	var err error
loop:
	for {
		var m qmpMessage
		if err = dec.Decode(&m); err != nil {
			break
		}
		switch {
		case first:
			first = false
			if m.Greeting == nil {
				err = errors.New("QMP: no greeting")
				greeting <- err
				break loop
			}
			greeting <- nil
			continue
		case m.Event != "":
			select {
			case q.events <- qmpEvent{Name: m.Event, Data: m.Data}:
			default: // nobody waits for this many: drop the oldest
				<-q.events
				q.events <- qmpEvent{Name: m.Event, Data: m.Data}
			}
			continue
		case m.Return != nil || m.Error != nil: // every return QEMU sends is an object
			q.replies <- m
			continue
		}
	}
	if first {
		first = false
		greeting <- fmt.Errorf("QMP greeting: %w", err)
	}
	q.err = err
	close(q.done)
}

// qmpError is a command QEMU refused.
type qmpError struct {
	Command, Class, Desc string
}

func (e *qmpError) Error() string { return fmt.Sprintf("QMP %s: %s (%s)", e.Command, e.Desc, e.Class) }

// execute runs a command and returns its "return" value.
func (q *qmp) execute(ctx context.Context, command string, args any) (json.RawMessage, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	msg := map[string]any{"execute": command}
	if args != nil {
		msg["arguments"] = args
	}
	b, err := json.Marshal(msg)
	if err != nil {
		return nil, err
	}
	if _, err := q.conn.Write(b); err != nil {
		return nil, fmt.Errorf("QMP %s: %w", command, err)
	}
	select {
	case m := <-q.replies:
		if m.Error != nil {
			return nil, &qmpError{Command: command, Class: m.Error.Class, Desc: m.Error.Desc}
		}
		return m.Return, nil
	case <-q.done:
		return nil, fmt.Errorf("QMP %s: the connection ended: %v", command, q.err)
	case <-ctx.Done():
		q.conn.Close() // an answer may still come: this connection is done
		return nil, fmt.Errorf("QMP %s: %w", command, ctx.Err())
	}
}

// waitEvent waits for an event named name whose data match (nil: any).
func (q *qmp) waitEvent(ctx context.Context, name string, match func(json.RawMessage) bool) error {
	for {
		select {
		case ev := <-q.events:
			if ev.Name == name && (match == nil || match(ev.Data)) {
				return nil
			}
		case <-q.done:
			return fmt.Errorf("QMP: waiting for %s: the connection ended: %v", name, q.err)
		case <-ctx.Done():
			return fmt.Errorf("QMP: waiting for %s: %w", name, ctx.Err())
		}
	}
}

// quiet drops events until none came for d.
func (q *qmp) quiet(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case <-q.events:
			t.Reset(d)
		case <-t.C:
			return nil
		case <-q.done:
			return fmt.Errorf("QMP: the connection ended: %v", q.err)
		case <-ctx.Done():
			return fmt.Errorf("QMP: waiting for the events to settle: %w", ctx.Err())
		}
	}
}

// Close ends the connection.
func (q *qmp) Close() error { return q.conn.Close() }
