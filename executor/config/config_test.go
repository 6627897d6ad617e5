package config

import (
	"testing"
	"time"

	"github.com/BurntSushi/toml"
)

func TestDefaultsAndSeconds(t *testing.T) {
	five, zero := 5, 0
	for _, tc := range []struct {
		v    *int
		want time.Duration
	}{{nil, time.Hour}, {&zero, time.Hour}, {&five, 5 * time.Second}} {
		if got := Seconds(tc.v, time.Hour); got != tc.want {
			t.Errorf("Seconds(%v) = %v, want %v", tc.v, got, tc.want)
		}
	}
	for v, want := range map[int]time.Duration{0: 30 * time.Second, -1: 0, 7: 7 * time.Second} {
		if got := (&Docker{WaitForServicesTimeout: v}).ServicesTimeout(); got != want {
			t.Errorf("wait_for_services_timeout %d: %v, want %v", v, got, want)
		}
	}
}

func TestStringListTakesAStringOrAList(t *testing.T) {
	var d Docker
	if _, err := toml.Decode(`pull_policy = "never"`, &d); err != nil || len(d.PullPolicy) != 1 || d.PullPolicy[0] != PullNever {
		t.Fatalf("string: %v %v", d.PullPolicy, err)
	}
	if _, err := toml.Decode(`pull_policy = ["if-not-present", "always"]`, &d); err != nil || len(d.PullPolicy) != 2 {
		t.Fatalf("list: %v %v", d.PullPolicy, err)
	}
	for _, bad := range []string{`pull_policy = 3`, `pull_policy = ["never", 3]`} {
		if _, err := toml.Decode(bad, &d); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
	if !ValidPullPolicy(PullAlways) || ValidPullPolicy("sometimes") {
		t.Error("ValidPullPolicy")
	}
}
