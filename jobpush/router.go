package jobpush

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/berthci/berth/jobpush/internal/pb"
)

// GitLab's Job Router (gitlab-next.md §4.3) is served on the same tunnel
// as the push channel: GitLab's runner with FF_USE_JOB_ROUTER dials the
// URL discovery names and calls gitlab.agent.job_router.rpc.JobRouter/
// GetJob, one jobs/request per call.

// Puller is a Source that also answers GitLab's Job Router.
type Puller interface {
	// RequestJob runs one POST /api/v4/jobs/request for the runner of
	// token: request is the request's JSON body; job is the JSON of the
	// job handed out (nil: none came within the long poll) and
	// lastUpdate the queue version jobs/request answers in
	// X-GitLab-Last-Update. Errors wrap ErrUnauthenticated, ErrOrphaned
	// or ErrBadRequest, or are gRPC statuses.
	RequestJob(ctx context.Context, token string, request []byte) (job []byte, lastUpdate string, err error)
}

// ErrBadRequest: a Job Router request whose body jobs/request refuses.
var ErrBadRequest = errors.New("bad job request")

// Metadata keys of GitLab's Job Router.
const (
	lastUpdateKey = "x-gitlab-last-update"
	requestIDKey  = "x-request-id"
)

// jobRouter serves GetJob against a Puller.
type jobRouter struct {
	pb.UnimplementedJobRouterServer
	s   *Server
	src Puller
}

// GetJob answers one jobs/request: the job's JSON, or empty bytes when
// none came, with the queue version in the x-gitlab-last-update header
// (the runner sends it back as last_update) and the request's
// x-request-id echoed.
func (r *jobRouter) GetJob(ctx context.Context, req *pb.GetJobRequest) (*pb.GetJobResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	token, err := callToken(md)
	if err != nil {
		return nil, err
	}
	job, lastUpdate, err := r.src.RequestJob(ctx, token, req.GetJobRequest())
	if err != nil {
		return nil, r.s.statusOf(err)
	}
	header := metadata.Pairs(lastUpdateKey, lastUpdate)
	if v := md.Get(requestIDKey); len(v) > 0 {
		header.Set(requestIDKey, v[0])
	}
	if err := grpc.SetHeader(ctx, header); err != nil {
		return nil, err
	}
	return &pb.GetJobResponse{JobResponse: job}, nil
}

// RouterClient calls a Job Router's GetJob as GitLab's runner does, over
// the transport discovery names: a gRPC tunnel over ws:// or wss:// (the
// token as Bearer on the handshake), or plain gRPC at grpc:// (port 80 by
// default) or grpcs:// (TLS, port 443). Each call carries the token as
// Bearer with gitlab-agent-type: runner. A broken connection is dialed
// again by the next call. Safe for concurrent use.
type RouterClient struct {
	cc    *grpc.ClientConn
	token string
	// dialErr is the last failure to open a ws(s) tunnel: gRPC reports it
	// as Unavailable, which would hide a handshake's 404 or 403.
	dialErr atomic.Pointer[error]
}

// DialRouter prepares a client of the Job Router at serverURL; nothing is
// dialed before the first call. For grpcs, the TLS configuration of
// o.HTTPClient's transport (the runner's tls-ca-file, client certificate)
// is used, as GitLab's runner uses its TLS files for the router too.
func DialRouter(serverURL, token string, o DialOptions) (*RouterClient, error) {
	u, err := url.Parse(serverURL)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("job router URL %q: want ws://, wss://, grpc:// or grpcs:// with a host", serverURL)
	}
	hc := o.HTTPClient
	if hc == nil {
		hc = http.DefaultClient
	}
	c := &RouterClient{token: token}
	switch u.Scheme {
	case "ws", "wss":
		c.cc, err = tunnelClient(u, func(ctx context.Context, _ string) (net.Conn, error) {
			conn, err := dialTunnel(ctx, serverURL, token, hc, o.Header)
			if err != nil {
				c.dialErr.Store(&err)
				return nil, err
			}
			c.dialErr.Store(nil)
			return conn, nil
		})
	case "grpc", "grpcs":
		creds := insecure.NewCredentials()
		port := "80"
		if u.Scheme == "grpcs" {
			port = "443"
			var tc *tls.Config
			if t, ok := hc.Transport.(*http.Transport); ok && t.TLSClientConfig != nil {
				tc = t.TLSClientConfig.Clone()
			} else {
				tc = &tls.Config{MinVersion: tls.VersionTLS12}
			}
			tc.NextProtos = nil // gRPC's own ALPN (h2)
			creds = credentials.NewTLS(tc)
		}
		target := u.Host
		if u.Port() == "" {
			target = net.JoinHostPort(u.Hostname(), port)
		}
		opts := append(clientOptions(), grpc.WithTransportCredentials(creds))
		if ua := o.Header.Get("User-Agent"); ua != "" {
			opts = append(opts, grpc.WithUserAgent(ua))
		}
		c.cc, err = grpc.NewClient("dns:///"+target, opts...)
	default:
		return nil, fmt.Errorf("job router URL %q: scheme %q is not ws, wss, grpc or grpcs", serverURL, u.Scheme)
	}
	if err != nil {
		return nil, fmt.Errorf("job router client: %w", err)
	}
	return c, nil
}

// GetJob sends one jobs/request body; job is the job's JSON, nil when
// none came, and lastUpdate the router's x-gitlab-last-update. Errors
// match ErrNotServed (the router is disabled) and ErrUnauthenticated as
// Dial's do.
func (c *RouterClient) GetJob(ctx context.Context, request []byte, requestID string) (job []byte, lastUpdate string, err error) {
	md := metadata.Pairs("authorization", "Bearer "+c.token, "gitlab-agent-type", "runner")
	if requestID != "" {
		md.Set(requestIDKey, requestID)
	}
	var header metadata.MD
	resp, err := pb.NewJobRouterClient(c.cc).GetJob(metadata.NewOutgoingContext(ctx, md),
		&pb.GetJobRequest{JobRequest: request}, grpc.Header(&header))
	if err != nil {
		if p := c.dialErr.Load(); p != nil && status.Code(err) == codes.Unavailable &&
			(errors.Is(*p, ErrNotServed) || errors.Is(*p, ErrUnauthenticated)) {
			return nil, "", fmt.Errorf("job router: %w", *p)
		}
		return nil, "", classify(err)
	}
	if v := header.Get(lastUpdateKey); len(v) > 0 {
		lastUpdate = v[0]
	}
	if len(resp.GetJobResponse()) == 0 {
		return nil, lastUpdate, nil
	}
	return resp.GetJobResponse(), lastUpdate, nil
}

// Close closes the client's connection.
func (c *RouterClient) Close() error { return c.cc.Close() }
