package wire

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/executor/plugin/internal/pb"
	"github.com/berthci/berth/runnerapi"
)

func TestFailureRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want error
	}{
		{fmt.Errorf("x: %w", executor.ErrNotPrepared), executor.ErrNotPrepared},
		{fmt.Errorf("pulling: %w", executor.ErrImagePull), executor.ErrImagePull},
		{fmt.Errorf("image: %w", executor.ErrNotAllowed), executor.ErrNotAllowed},
		{fmt.Errorf("bad: %w", ErrConfig), ErrConfig},
		{fmt.Errorf("stage: %w", context.Canceled), ErrCanceled},
	} {
		got := FromFailure(ToFailure(tc.err))
		if !errors.Is(got, tc.want) || got.Error() != tc.err.Error() {
			t.Errorf("%v → %v: want an error wrapping %v with the same message", tc.err, got, tc.want)
		}
	}
	sys := FromFailure(ToFailure(errors.New("disk full")))
	for _, s := range []error{executor.ErrNotPrepared, executor.ErrImagePull, executor.ErrNotAllowed, ErrConfig, ErrCanceled} {
		if errors.Is(sys, s) {
			t.Errorf("a system failure wraps %v", s)
		}
	}
	if ToFailure(nil) != nil || FromFailure(nil) != nil {
		t.Error("nil must stay nil")
	}
}

func TestFeatures(t *testing.T) {
	f := runnerapi.Features{Variables: true}
	ApplyFeatures(&f, map[string]bool{"image": true, "services": false, "from_the_future": true})
	if !f.Variables || !f.Image || f.Services {
		t.Fatalf("%+v", f)
	}
	m := FeaturesToMap(runnerapi.Features{Shared: true, Cache: true})
	if len(m) != 2 || !m["shared"] || !m["cache"] {
		t.Fatalf("%v", m)
	}
}

// FuzzPluginMessages feeds what a plugin sends (arbitrary bytes decoded as
// its messages) through the host's conversions: they must never panic,
// and an environment is accepted only with what the runner needs.
func FuzzPluginMessages(f *testing.F) {
	seed, _ := proto.Marshal(&pb.DescribeResponse{Features: map[string]bool{"image": true}, Failure: &pb.Failure{Kind: 3, Message: "x"}})
	f.Add(seed)
	env, _ := proto.Marshal(&pb.PrepareEvent{Event: &pb.PrepareEvent_Environment{Environment: &pb.Environment{BuildDir: "/b", TmpDir: "/t", Shell: "sh", Helper: "/h"}}})
	f.Add(env)
	f.Fuzz(func(t *testing.T, data []byte) {
		var d pb.DescribeResponse
		if proto.Unmarshal(data, &d) == nil {
			var feats runnerapi.Features
			ApplyFeatures(&feats, d.GetFeatures())
			_ = FromFailure(d.GetFailure())
		}
		var ev pb.PrepareEvent
		if proto.Unmarshal(data, &ev) == nil {
			if e, err := EnvironmentFromPB(ev.GetEnvironment()); err == nil {
				if e.BuildDir == "" || e.TmpDir == "" || e.Helper == "" || (e.Shell != "bash" && e.Shell != "sh") {
					t.Fatalf("accepted an incomplete environment %+v", e)
				}
			}
		}
	})
}

func TestEnvironmentRoundTrip(t *testing.T) {
	in := executor.Environment{BuildDir: "/b", TmpDir: "/b.tmp", CacheDir: "/c", Shell: "bash", Helper: "/h", Hostname: "x",
		Variables: []runnerapi.Variable{{Key: "GITLAB_RUNNER_SLOT_CGROUP", Value: "g/slot-1", Public: true}, {Key: "S", Value: "v", Masked: true}}}
	out, err := EnvironmentFromPB(EnvironmentToPB(in))
	if err != nil || !reflect.DeepEqual(in, out) {
		t.Fatalf("round trip: %+v %v, want %+v", out, err, in)
	}
}
