package main

import (
	"slices"
	"testing"

	"github.com/berthci/berth/bench"
)

func TestWarmSpeedups(t *testing.T) {
	row := func(accel, start string, firstLine float64, skipped, err string) microVMBenchRow {
		r := microVMBenchRow{Accel: accel, Start: start, Skipped: skipped}
		r.ExecutorResult = bench.ExecutorResult{FirstLineP50Ms: firstLine, Err: err}
		return r
	}
	got := warmSpeedups([]microVMBenchRow{
		row("tcg", "cold", 4600, "", ""),
		row("tcg", "warm", 400, "", ""),
		row("kvm", "cold", 0, "the probe VM did not boot", ""),
		row("kvm", "warm", 0, "the probe VM did not boot", ""),
	})
	want := []string{"tcg: a warm start reaches the first script line 11.5× sooner than a cold boot (400 ms vs 4600 ms)"}
	if !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
	if got := warmSpeedups([]microVMBenchRow{row("tcg", "cold", 4600, "", ""), row("tcg", "warm", 0, "", "boom")}); len(got) != 0 {
		t.Errorf("a failed warm run is compared: %q", got)
	}
}
