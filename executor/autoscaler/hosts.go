package autoscaler

import (
	"context"
	"errors"
	"log/slog"
	"sync"

	"github.com/berthci/berth/fleeting"
	"github.com/berthci/berth/fleeting/connector"
)

// Host is what an Instances builds over an instance's connection (a
// docker provider through its engine's socket, a nesting client …).
type Host interface {
	// Shutdown releases it; the connection is closed after.
	Shutdown(ctx context.Context) error
}

// Hosts keeps, for an Instances, one connector connection per instance
// and the Host built over it: made on first use, made again once the
// connection broke, dropped when the instance is forgotten.
type Hosts[H Host] struct {
	// Connector are the connection's options (Logger is set from Logger).
	Connector connector.Options
	Logger    *slog.Logger
	// Make builds the instance's Host over conn. On an error conn is
	// closed.
	Make func(ctx context.Context, id string, conn *connector.Client) (H, error)

	mu sync.Mutex
	m  map[string]*hostConn[H]
}

type hostConn[H Host] struct {
	conn *connector.Client
	host H
}

// Get returns instance id's connection and Host.
func (hs *Hosts[H]) Get(ctx context.Context, id string, info fleeting.ConnectInfo) (H, *connector.Client, error) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if hc, ok := hs.m[id]; ok {
		select {
		case <-hc.conn.Done():
			_ = hc.host.Shutdown(context.WithoutCancel(ctx))
			hc.conn.Close()
			delete(hs.m, id)
		default:
			return hc.host, hc.conn, nil
		}
	}
	copts := hs.Connector
	copts.Logger = hs.Logger
	var zero H
	conn, err := connector.Dial(ctx, info, copts)
	if err != nil {
		return zero, nil, err
	}
	h, err := hs.Make(ctx, id, conn)
	if err != nil {
		conn.Close()
		return zero, nil, err
	}
	if hs.m == nil {
		hs.m = map[string]*hostConn[H]{}
	}
	hs.m[id] = &hostConn[H]{conn: conn, host: h}
	return h, conn, nil
}

// Forget drops what is kept for instance id.
func (hs *Hosts[H]) Forget(id string) {
	hs.mu.Lock()
	hc := hs.m[id]
	delete(hs.m, id)
	hs.mu.Unlock()
	if hc != nil {
		_ = hc.host.Shutdown(context.Background())
		hc.conn.Close()
	}
}

// Shutdown drops everything kept.
func (hs *Hosts[H]) Shutdown(ctx context.Context) error {
	hs.mu.Lock()
	m := hs.m
	hs.m = nil
	hs.mu.Unlock()
	var errs []error
	for _, hc := range m {
		errs = append(errs, hc.host.Shutdown(ctx))
		hc.conn.Close()
	}
	return errors.Join(errs...)
}
