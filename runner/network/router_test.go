package network

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berthci/berth/jobpush"
	"github.com/berthci/berth/runnerapi"
)

// fakeRouter answers GetJob calls from a list and records the bodies.
type fakeRouter struct {
	bodies  []runnerapi.JobRequest
	answers []func() ([]byte, string, error)
}

func (f *fakeRouter) GetJob(_ context.Context, request []byte, requestID string) ([]byte, string, error) {
	var r runnerapi.JobRequest
	if err := json.Unmarshal(request, &r); err != nil || requestID == "" {
		return nil, "", status.Error(codes.Internal, "bad call")
	}
	f.bodies = append(f.bodies, r)
	a := f.answers[0]
	f.answers = f.answers[1:]
	return a()
}

func TestRequestJobRouted(t *testing.T) {
	c := testClient()
	rc := RunnerCredentials{URL: "https://gitlab.example.com", Token: "glrt-r"}
	f := &fakeRouter{answers: []func() ([]byte, string, error){
		func() ([]byte, string, error) { return nil, "v1", nil },
		func() ([]byte, string, error) { return []byte(`{"id":5,"token":"jt"}`), "v2", nil },
		func() ([]byte, string, error) { return nil, "", nil },
	}}
	ctx := context.Background()
	if j, err := c.RequestJobRouted(ctx, f, rc, "s_1", nil, false); j != nil || err != nil {
		t.Fatalf("no job: %v %v", j, err)
	}
	j, err := c.RequestJobRouted(ctx, f, rc, "s_1", nil, false)
	if err != nil || j == nil || j.ID != 5 || j.Token != "jt" {
		t.Fatalf("job: %+v %v", j, err)
	}
	if lu := c.LastUpdate(rc); lu != "v2" {
		t.Errorf("last update %q, want the router's v2", lu)
	}
	// The router's version is echoed as last_update; at once sends none.
	_, _ = c.RequestJobRouted(ctx, f, rc, "s_1", nil, true)
	for i, want := range []string{"", "v1", ""} {
		if b := f.bodies[i]; b.LastUpdate != want || b.Token != "glrt-r" || b.SystemID != "s_1" {
			t.Errorf("call %d: body %+v, want last_update %q", i, b, want)
		}
	}

	for name, tc := range map[string]struct {
		err  error
		want error
	}{
		"refused token": {jobpush.ErrUnauthenticated, ErrForbidden},
		"orphaned":      {status.Error(codes.FailedPrecondition, "runner is orphaned"), ErrOrphaned},
		"rate limited":  {status.Error(codes.ResourceExhausted, "slow down"), ErrTooManyRequests},
		"disabled":      {jobpush.ErrNotServed, jobpush.ErrNotServed},
	} {
		f.answers = []func() ([]byte, string, error){func() ([]byte, string, error) { return nil, "", tc.err }}
		if _, err := c.RequestJobRouted(ctx, f, rc, "s_1", nil, false); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
	f.answers = []func() ([]byte, string, error){func() ([]byte, string, error) { return nil, "", status.Error(codes.Unavailable, "down") }}
	_, err = c.RequestJobRouted(ctx, f, rc, "s_1", nil, false)
	var se *StatusError
	if status.Code(err) != codes.Unavailable || errors.As(err, &se) {
		t.Errorf("transport failure: %v, want the Unavailable status", err)
	}
	f.answers = []func() ([]byte, string, error){func() ([]byte, string, error) { return []byte("{nope"), "", nil }}
	if _, err := c.RequestJobRouted(ctx, f, rc, "s_1", nil, false); !errors.Is(err, ErrUnexpected) {
		t.Errorf("a job that is not JSON: %v", err)
	}
}
