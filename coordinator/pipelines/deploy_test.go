package pipelines

import (
	"strings"
	"testing"

	"github.com/berthci/berth/coordinator/store"
)

func TestEnvironmentSlugAndTier(t *testing.T) {
	for name, want := range map[string]string{
		"production": "production", "review/feature-1": "review-feature-1-", "Production": "production-",
		"1env": "env-1env-", "a-very-long-environment-name-indeed": "a-very-long-envir-",
	} {
		got := EnvironmentSlug(name)
		if !strings.HasPrefix(got, want) || len(got) > 24 || (strings.HasSuffix(want, "-") && len(got) != len(want)+6) {
			t.Errorf("EnvironmentSlug(%q) = %q, want %q (+ a 6-character suffix when it ends in -)", name, got, want)
		}
	}
	if EnvironmentSlug("review/x") != EnvironmentSlug("review/x") || EnvironmentSlug("review/x") == EnvironmentSlug("review-x") {
		t.Error("slugs are not stable, or not told apart by their suffix")
	}
	for name, want := range map[string]string{"production": "production", "prd": "production", "staging": "staging",
		"review/x": "development", "test": "testing", "qa": "testing", "customer-portal": "other", "nonprod": "staging"} {
		if got := guessTier(name); got != want {
			t.Errorf("guessTier(%q) = %q, want %q", name, got, want)
		}
	}
	for st, want := range map[store.Status]string{store.StatusCreated: "created", store.StatusManual: "created", store.StatusPending: "created",
		store.StatusRunning: "running", store.StatusCanceling: "running", store.StatusSuccess: "success", store.StatusFailed: "failed",
		store.StatusCanceled: "canceled", store.StatusSkipped: "skipped"} {
		if got := deploymentStatus(st); got != want {
			t.Errorf("deploymentStatus(%s) = %s, want %s", st, got, want)
		}
	}
}

func TestGuessTier(t *testing.T) {
	for name, want := range map[string]string{
		"production": "production", "prd": "production", "live": "production",
		"staging": "staging", "pre-prod": "staging", "demo": "staging",
		"review/feature": "development", "dev": "development",
		"test": "testing", "qa": "testing", "acceptance": "testing",
		"customer-portal": "other",
	} {
		if got := guessTier(name); got != want {
			t.Errorf("guessTier(%q) = %s, want %s", name, got, want)
		}
	}
}
