// Package jobpush is Berth's job push channel: besides the jobs/request
// long poll, a runner manager may hold one gRPC stream per runner and
// coordinator over which the coordinator pushes the jobs the runner has
// room for (docs/push.md; the protocol's specification is
// internal/pb/jobpush.proto).
//
// The stream is tunnelled over a WebSocket as GitLab's Job Router tunnels
// its gRPC (binary frames, subprotocol ws-tunnel, Authorization: Bearer
// with the runner token on the upgrade), so any HTTP reverse proxy —
// Berth's Cells router among them — routes it by header. The runner finds
// it through GET /api/v4/runners/router/discovery (DiscoveryResponse).
//
// Both ends live here, apart from what they push and admit:
//
//   - Server serves the stream on the coordinator and runs its state
//     machine (capacity, hand-outs, answers, releases) over a Source, the
//     coordinator's jobs (coordinator/runnerhttp implements it).
//   - Dial opens a stream from the runner (runner/ and the dispatch
//     benchmark use it); Stream sends capacity and answers and receives
//     jobs.
package jobpush

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/codes"

	"github.com/berthci/berth/runnerapi"
)

// Wire names.
const (
	// Path is where the coordinator upgrades to the tunnel.
	Path = "/api/v4/berth/job-router"
	// DiscoveryPath is GitLab's Job Router discovery endpoint, relative to
	// the API base (/api/v4/).
	DiscoveryPath = "runners/router/discovery"
	// Subprotocol is the WebSocket subprotocol of the tunnel (GitLab's).
	Subprotocol = "ws-tunnel"
	// FeatureFlag turns the push channel on for a [[runners]] entry
	// (GitLab's flag for its Job Router).
	FeatureFlag = "FF_USE_JOB_ROUTER"
)

// Limits of what a peer may send.
const (
	// MaxSystemID bounds a Hello's system_id (GitLab: 64 characters).
	MaxSystemID = 64
	// MaxInfo bounds a Hello's info JSON.
	MaxInfo = 64 << 10
	// MaxPayload bounds a pushed job's payload (the runner reads at most
	// as much of a jobs/request answer).
	MaxPayload = 64 << 20
)

// Errors a Source returns, mapped to gRPC codes by the Server.
var (
	// ErrUnauthenticated: the token does not authenticate (any more):
	// codes.Unauthenticated.
	ErrUnauthenticated = errors.New("runner token does not authenticate")
	// ErrOrphaned: the runner's project is gone: codes.FailedPrecondition
	// (jobs/request answers 422).
	ErrOrphaned = errors.New("runner is orphaned")
	// ErrBadHello: the stream did not start with a valid Hello:
	// codes.InvalidArgument.
	ErrBadHello = errors.New("bad hello")
)

// Hello is what a runner manager says when it opens a stream.
type Hello struct {
	// SystemID identifies the runner manager (jobs/request's system_id).
	SystemID string
	// Info is jobs/request's info object.
	Info *runnerapi.Info
	// Capacity is the runner's room when it opened the stream.
	Capacity Capacity
	// Acknowledge asks that the runner's admits acknowledge their jobs on
	// the stream (Stream.Acknowledges tells whether the coordinator
	// agreed); otherwise the runner acknowledges each job on REST.
	Acknowledge bool
}

// Capacity is how many more jobs a runner could start now.
type Capacity struct {
	// Free counts the jobs the runner could start now (absolute).
	Free uint32
	// Seen counts the jobs the runner had received on the stream when it
	// counted Free.
	Seen uint64
}

// Job is a job pushed to a runner.
type Job struct {
	ID int64
	// Payload is the jobs/request answer's body for this hand-out.
	Payload []byte
}

// Ack is the coordinator's answer to an admit that acknowledges its job
// (a stream whose Hello and Ready said Acknowledge): what PUT /jobs/:id
// state=running would have answered.
type Ack struct {
	JobID int64
	// Code is OK when the job is the runner's and running (or canceling:
	// JobStatus says); FailedPrecondition when it no longer waits for this
	// runner (REST's 403 or 409: the runner drops it); Unavailable when
	// the coordinator could not record the acknowledgement now (the runner
	// acknowledges on REST instead).
	Code    codes.Code
	Message string
	// JobStatus is the job's status (REST's Job-Status header).
	JobStatus string
	// TraceUpdateInterval is REST's X-GitLab-Trace-Update-Interval (0:
	// none given).
	TraceUpdateInterval time.Duration
}

// AckVerdict is what a runner makes of the answer to an acknowledging
// admit (AckWait's result).
type AckVerdict int

// The verdicts.
const (
	// AckAccepted: the job is the runner's; Ack says its status.
	AckAccepted AckVerdict = iota
	// AckRefused: the job no longer waits for this runner (REST's 403 or
	// 409): the runner drops it.
	AckRefused
	// AckOnREST: no answer (the stream ended first, or the coordinator
	// could not record it): the runner acknowledges on REST, which
	// answers whether the admit was recorded.
	AckOnREST
)

// Verdict reads AckWait's result.
func Verdict(a Ack, err error) AckVerdict {
	switch {
	case err != nil || a.Code == codes.Unavailable:
		return AckOnREST
	case a.Code == codes.OK:
		return AckAccepted
	default:
		return AckRefused
	}
}

// DecodeInfo reads a Hello's info JSON: empty means none; anything else
// must be one JSON object of at most MaxInfo bytes (unknown fields are
// ignored, as the Runner API does).
func DecodeInfo(b []byte) (*runnerapi.Info, error) {
	if len(b) == 0 {
		return nil, nil
	}
	if len(b) > MaxInfo {
		return nil, fmt.Errorf("%w: info is %d bytes, at most %d", ErrBadHello, len(b), MaxInfo)
	}
	var info runnerapi.Info
	if err := json.Unmarshal(b, &info); err != nil {
		return nil, fmt.Errorf("%w: info: %w", ErrBadHello, err)
	}
	return &info, nil
}

// CheckSystemID accepts a Hello's system_id: printable UTF-8 of at most
// MaxSystemID bytes (empty: the legacy manager, as on jobs/request).
func CheckSystemID(s string) error {
	if len(s) > MaxSystemID {
		return fmt.Errorf("%w: system_id is %d bytes, at most %d", ErrBadHello, len(s), MaxSystemID)
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("%w: system_id is not UTF-8", ErrBadHello)
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("%w: system_id has a control character", ErrBadHello)
		}
	}
	return nil
}

// DiscoveryResponse is the body of GET /api/v4/runners/router/discovery
// (GitLab's): where the push channel is.
type DiscoveryResponse struct {
	ServerURL string `json:"server_url"`
}

// ServerURL is the push channel's address for a coordinator's external
// URL: its scheme made ws (wss for https), Path appended to its path.
func ServerURL(externalURL string) (string, error) {
	u, err := url.Parse(strings.TrimSuffix(externalURL, "/"))
	if err != nil {
		return "", fmt.Errorf("external URL %q: %w", externalURL, err)
	}
	switch u.Scheme {
	case "http":
		u.Scheme = "ws"
	case "https":
		u.Scheme = "wss"
	default:
		return "", fmt.Errorf("external URL %q: want http or https", externalURL)
	}
	u.Path = strings.TrimSuffix(u.Path, "/") + Path
	u.RawPath, u.RawQuery, u.Fragment, u.User = "", "", "", nil
	return u.String(), nil
}

// ErrNoServer: discovery named no push channel or Job Router this runner
// can use.
var ErrNoServer = errors.New("no push channel")

// ParseDiscovery reads a discovery answer's body: the server_url must be
// a URL with a host, ws:// or wss:// (Berth's push channel, or GitLab's
// Job Router tunnelled over a WebSocket) or grpc:// or grpcs:// (GitLab's
// Job Router on plain gRPC, which has only GetJob). An empty or absent
// server_url, or another scheme, is ErrNoServer.
func ParseDiscovery(body []byte) (*url.URL, error) {
	var d DiscoveryResponse
	if err := json.Unmarshal(body, &d); err != nil {
		return nil, fmt.Errorf("discovery answer: %w", err)
	}
	if strings.TrimSpace(d.ServerURL) == "" {
		return nil, ErrNoServer
	}
	u, err := url.Parse(d.ServerURL)
	if err != nil {
		return nil, fmt.Errorf("discovery answer: server_url: %w", err)
	}
	switch u.Scheme {
	case "ws", "wss", "grpc", "grpcs":
	default:
		return nil, fmt.Errorf("%w: server_url %q: scheme %q is not ws, wss, grpc or grpcs", ErrNoServer, d.ServerURL, u.Scheme)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("%w: server_url %q has no host", ErrNoServer, d.ServerURL)
	}
	if u.User != nil {
		return nil, fmt.Errorf("%w: server_url carries credentials", ErrNoServer)
	}
	return u, nil
}
