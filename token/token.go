// Package token is the one place where Berth mints, recognises and digests
// secrets: registration tokens, runner authentication tokens, job tokens and
// admin tokens. Keeping generation here lets the format change (for example
// to Cells' routable tokens) without touching callers.
//
// Plain tokens are shown once (to whoever created them) and never stored:
// stores keep Digest(token) and compare digests with Equal, which runs in
// constant time.
package token

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"strings"
)

// Kind is what a token is for.
type Kind int

// Token kinds.
const (
	Unknown Kind = iota
	// Registration is a legacy runner registration token (GR1348941…).
	Registration
	// RunnerAuth is a runner authentication token of a runner created
	// through the API (glrt-t1_…, glrt-t2_…, glrt-t3_…).
	RunnerAuth
	// RunnerAuthLegacy is the authentication token handed to a runner
	// registered with a registration token (glrtr-…).
	RunnerAuthLegacy
	// Job is a CI/CD job token (glcbt-…).
	Job
	// Personal is a personal/admin access token (glpat-…).
	Personal
	// Trigger is a pipeline trigger token (glptt-…).
	Trigger
)

// Prefixes of the token kinds, as GitLab spells them.
const (
	PrefixRegistration     = "GR1348941"
	PrefixRunnerAuth       = "glrt-"
	PrefixRunnerAuthLegacy = "glrtr-"
	PrefixJob              = "glcbt-"
	PrefixPersonal         = "glpat-"
	PrefixTrigger          = "glptt-"
)

// MaskPrefixes are token prefixes whose tokens must be masked in job logs
// (sent to runners as features.token_mask_prefixes).
var MaskPrefixes = []string{"glpat-", "glrt-", "glrtr-", "glcbt-", "glptt-", "gldt-", "GR1348941"}

// Scope marks which partition a runner token belongs to, like GitLab's tN_
// marker: 1 instance, 2 group, 3 project.
type Scope int

// Runner scopes for the tN_ marker.
const (
	ScopeInstance Scope = 1
	ScopeGroup    Scope = 2
	ScopeProject  Scope = 3
)

// randomLen is the number of random bytes in every token (192 bits).
const randomLen = 24

func random() string {
	b := make([]byte, randomLen)
	randomBytes(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// randomBytes fills b from crypto/rand.
func randomBytes(b []byte) {
	if _, err := rand.Read(b); err != nil {
		// crypto/rand never fails on supported platforms (Go 1.24+ panics
		// itself); keep the contract explicit.
		panic("token: crypto/rand failed: " + err.Error())
	}
}

// NewRegistration mints a legacy registration token.
func NewRegistration() string { return PrefixRegistration + random() }

// NewRunnerAuth mints the authentication token of a runner created through
// the API, with the partition marker of its scope.
func NewRunnerAuth(s Scope) string { return RunnerAuthPrefix(s) + random() }

// RunnerAuthPrefix is the prefix of a runner authentication token of
// scope s: glrt- and the partition marker (glrt-t1_, glrt-t2_, glrt-t3_).
func RunnerAuthPrefix(s Scope) string { return PrefixRunnerAuth + "t" + string(rune('0'+int(s))) + "_" }

// NewRunnerAuthLegacy mints the authentication token of a runner registered
// with a registration token.
func NewRunnerAuthLegacy() string { return PrefixRunnerAuthLegacy + random() }

// NewJob mints a job token.
func NewJob() string { return PrefixJob + random() }

// NewPersonal mints a personal (admin) access token.
func NewPersonal() string { return PrefixPersonal + random() }

// NewTrigger mints a pipeline trigger token.
func NewTrigger() string { return PrefixTrigger + random() }

// KindOf recognises a token by its prefix. It does not validate it.
func KindOf(t string) Kind {
	switch {
	case strings.HasPrefix(t, PrefixRunnerAuthLegacy):
		return RunnerAuthLegacy
	case strings.HasPrefix(t, PrefixRunnerAuth):
		return RunnerAuth
	case strings.HasPrefix(t, PrefixJob):
		return Job
	case strings.HasPrefix(t, PrefixPersonal):
		return Personal
	case strings.HasPrefix(t, PrefixTrigger):
		return Trigger
	case strings.HasPrefix(t, PrefixRegistration):
		return Registration
	}
	return Unknown
}

// Digest returns the lower-case hex SHA-256 of a token: what stores keep.
func Digest(t string) string {
	sum := sha256.Sum256([]byte(t))
	return hex.EncodeToString(sum[:])
}

// Equal compares two digests (or any two secrets) in constant time.
func Equal(a, b string) bool {
	return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

// Short returns the short form of a token used in logs and metrics: the
// first 9 characters after the kind prefix and a tN_ partition marker.
func Short(t string) string {
	for _, p := range []string{PrefixRunnerAuthLegacy, PrefixRunnerAuth, PrefixJob, PrefixPersonal, PrefixTrigger, PrefixRegistration} {
		if strings.HasPrefix(t, p) {
			t = t[len(p):]
			break
		}
	}
	if len(t) > 3 && t[0] == 't' && t[1] >= '0' && t[1] <= '9' && t[2] == '_' {
		t = t[3:]
	}
	if len(t) > 9 {
		t = t[:9]
	}
	return t
}
