// Package jobtoken mints and verifies CI/CD job tokens: "glcbt-" followed
// by a JWT, as GitLab's job tokens are (reference: gitlab-next.md §1.3),
// signed with a key of the coordinator's cell, naming the job, its
// project and cell (GitLab's routing claims, so a router finds the cell
// without a database), what the holder may do (scopes) and until when.
//
// A job gets two tokens at its hand-out, sharing one secret hand-out id
// (the JWT's jti), whose digest is all the store keeps:
//
//   - the runner's (the payload's token): every scope — acknowledge and
//     update the job, send its log, upload and download its artifacts,
//     fetch its repository;
//   - the script's (CI_JOB_TOKEN, the repository URL's credentials, the
//     dependencies' download tokens): fetch the repository and download
//     the artifacts of the job and its dependencies only, so a job's
//     script cannot report its own job as succeeded or rewrite its log.
//
// A token is valid while its signature, audience and expiry check out,
// its hand-out id is the job's current one (a job handed out again gets
// new tokens) and the job is handed out and not finished: the end of the
// job revokes it. The key that signs is the newest; every key in the
// store verifies, so keys rotate without downtime (Rotate, then Remove
// once the old tokens have expired). Keys live in the store, so every
// replica of a cell verifies every token.
package jobtoken

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/token"
)

// Scope is one thing a job token allows.
type Scope string

// The scopes.
const (
	// ScopeJob: PUT /jobs/:id (acknowledge, keep alive, final state).
	ScopeJob Scope = "job"
	// ScopeTrace: PATCH /jobs/:id/trace.
	ScopeTrace Scope = "trace"
	// ScopeArtifactsWrite: POST /jobs/:id/artifacts of the job itself.
	ScopeArtifactsWrite Scope = "artifacts:write"
	// ScopeArtifactsRead: GET /jobs/:id/artifacts of the job itself and
	// of its dependencies.
	ScopeArtifactsRead Scope = "artifacts:read"
	// ScopeRepositoryRead: git fetch of the job's project (or of a
	// public one).
	ScopeRepositoryRead Scope = "repository:read"
)

// RunnerScopes are the runner's token's scopes; ScriptScopes the job
// script's.
var (
	RunnerScopes = []Scope{ScopeJob, ScopeTrace, ScopeArtifactsWrite, ScopeArtifactsRead, ScopeRepositoryRead}
	ScriptScopes = []Scope{ScopeArtifactsRead, ScopeRepositoryRead}
)

// Audience is the aud of every job token (GitLab's).
const Audience = "gitlab-authz-token"

// version is GitLab's job token JWT version claim.
const version = "0.1.0"

// SettingKeys is the store setting holding the signing keys (JSON).
const SettingKeys = "job_token_keys"

// Errors of Verify.
var (
	// ErrInvalid: not a job token of this cell (malformed, bad signature,
	// unknown key, wrong audience or cell).
	ErrInvalid = errors.New("invalid job token")
	// ErrExpired: the token's exp has passed.
	ErrExpired = errors.New("expired job token")
)

// Claims are what a job token says.
type Claims struct {
	JobID     int64
	ProjectID int64
	// Cell and Organization route the token (0: no cell).
	Cell         int64
	Organization int64
	Scopes       []Scope
	// Dependencies are the jobs whose artifacts the holder may download.
	Dependencies []int64
	IssuedAt     time.Time
	Expires      time.Time
	// HandOut is the hand-out's secret id (jti); the store keeps its
	// digest (HandOutDigest) as the job's token digest.
	HandOut string
}

// Allows reports whether the token has scope s.
func (c *Claims) Allows(s Scope) bool { return slices.Contains(c.Scopes, s) }

// MayRead reports whether the token may download the artifacts of job id:
// its own or a dependency's.
func (c *Claims) MayRead(id int64) bool {
	return c.Allows(ScopeArtifactsRead) && (id == c.JobID || slices.Contains(c.Dependencies, id))
}

// NewHandOut returns a fresh hand-out id (192 random bits).
func NewHandOut() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// HandOutDigest is what the store keeps of a hand-out id.
func HandOutDigest(handOut string) string { return token.Digest("jti:" + handOut) }

// IsJWT reports whether tok is a job token in JWT form (older job tokens
// are random strings).
func IsJWT(tok string) bool {
	return strings.HasPrefix(tok, token.PrefixJob) && strings.Count(tok, ".") == 2
}

// wire are the JWT claims as Verify reads them: GitLab's, routing claims
// in base36 strings, and Berth's scopes and dependencies (Mint writes the
// same names, appendClaims).
type wire struct {
	Issuer    string   `json:"iss"`
	Subject   string   `json:"sub"`
	Audience  audience `json:"aud"`
	Expiry    *float64 `json:"exp"`
	NotBefore *float64 `json:"nbf"`
	IssuedAt  *float64 `json:"iat"`
	ID        string   `json:"jti"`
	Version   string   `json:"version"`
	Cell      string   `json:"c"`
	Org       string   `json:"o"`
	Project   string   `json:"p"`
	Scopes    []Scope  `json:"scp"`
	Deps      []int64  `json:"dep"`
}

// audience is a JWT aud: one string or an array of them (RFC 7519 §4.1.3).
type audience []string

func (a *audience) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*a = audience{s}
		return nil
	}
	return json.Unmarshal(b, (*[]string)(a))
}

const subjectPrefix = "gid://gitlab/Ci::Build/"

// Clock tells the time.
type Clock interface{ Now() time.Time }

// key is one signing key.
type key struct {
	KID     string    `json:"kid"`
	Secret  []byte    `json:"secret"`
	Created time.Time `json:"created"`
	// header is the base64url JWS header of the key's tokens (headerOf).
	header string
}

// headerOf is the JWS protected header of the tokens key kid signs,
// base64url-encoded: {"alg":"HS256","kid":…,"typ":"JWT"}, byte for byte
// what go-jose wrote for Berth before, so tokens minted by either verify.
// Verify accepts no other header: Berth alone mints its tokens, and a
// token is checked against its key's header before anything of it is
// parsed (no algorithm or key choice is left to the token).
func headerOf(kid string) string {
	h, _ := json.Marshal(struct {
		Alg string `json:"alg"`
		KID string `json:"kid"`
		Typ string `json:"typ"`
	}{"HS256", kid, "JWT"})
	return base64.RawURLEncoding.EncodeToString(h)
}

// KeyInfo describes a key without its secret.
type KeyInfo struct {
	KID     string    `json:"kid"`
	Created time.Time `json:"created"`
	// Signing is set on the newest key, the one that signs.
	Signing bool `json:"signing"`
}

// reloadEvery bounds how often an unknown key id makes Keys read the
// store again; signReload how long Mint may sign with a key after a
// newer one was added (it reads the store that often).
const (
	reloadEvery = time.Second
	signReload  = 10 * time.Second
)

// Keys mints and verifies the job tokens of one cell. Safe for
// concurrent use.
type Keys struct {
	st     store.Store
	clock  Clock
	issuer string
	cell   int64

	mu     sync.Mutex
	keys   []key // oldest first
	loaded time.Time
}

// Options configure Keys.
type Options struct {
	Store store.Store
	Clock Clock
	// Issuer is the iss claim: the coordinator's external URL.
	Issuer string
	// Cell is the cell the coordinator belongs to (0: none). Tokens carry
	// it, and a token of another cell does not verify.
	Cell int64
}

// New returns the keys of opts.Store; they are read (and the first one
// created, when there is none) on first use.
func New(opts Options) *Keys {
	return &Keys{st: opts.Store, clock: opts.Clock, issuer: opts.Issuer, cell: opts.Cell}
}

// Open is New, reading the keys now.
func Open(ctx context.Context, opts Options) (*Keys, error) {
	k := New(opts)
	if err := k.ensure(ctx); err != nil {
		return nil, err
	}
	return k, nil
}

// ensure reads the keys if they were not read yet, creating the first
// key when the store has none.
func (k *Keys) ensure(ctx context.Context) error {
	k.mu.Lock()
	loaded := len(k.keys) > 0
	k.mu.Unlock()
	if loaded {
		return nil
	}
	keys, err := load(ctx, k.st)
	if err != nil {
		return err
	}
	if len(keys) == 0 {
		if _, err := Rotate(ctx, k.st); err != nil {
			return err
		}
		if keys, err = load(ctx, k.st); err != nil {
			return err
		}
	}
	k.mu.Lock()
	if len(k.keys) == 0 {
		k.keys, k.loaded = keys, time.Now()
	}
	k.mu.Unlock()
	return nil
}

// Mint signs a token with claims c (HandOut, JobID and Expires required).
func (k *Keys) Mint(ctx context.Context, c Claims) (string, error) {
	if c.HandOut == "" || c.JobID <= 0 || c.Expires.IsZero() {
		return "", errors.New("minting a job token: hand-out, job and expiry are required")
	}
	if err := k.ensure(ctx); err != nil {
		return "", err
	}
	k.mu.Lock()
	due := time.Since(k.loaded) >= signReload
	k.mu.Unlock()
	if due {
		// A rotation elsewhere: sign with the newest key. A failed read
		// keeps the keys known (and is tried again next time).
		if keys, err := load(ctx, k.st); err == nil && len(keys) > 0 {
			k.mu.Lock()
			k.keys, k.loaded = keys, time.Now()
			k.mu.Unlock()
		}
	}
	k.mu.Lock()
	signing := k.keys[len(k.keys)-1]
	k.mu.Unlock()
	return string(sign(signing, k.appendClaims(make([]byte, 0, 512), c))), nil
}

// sign returns "glcbt-" and the compact JWS of payload signed by key
// (HS256), in one allocation.
func sign(key key, payload []byte) []byte {
	b64 := base64.RawURLEncoding
	out := make([]byte, 0, len(token.PrefixJob)+len(key.header)+b64.EncodedLen(len(payload))+b64.EncodedLen(sha256.Size)+2)
	out = append(out, token.PrefixJob...)
	out = append(out, key.header...)
	out = append(out, '.')
	out = b64.AppendEncode(out, payload)
	mac := hmac.New(sha256.New, key.Secret)
	mac.Write(out[len(token.PrefixJob):])
	out = append(out, '.')
	return b64.AppendEncode(out, mac.Sum(nil))
}

// appendClaims appends the JWT claims of c, as encoding/json would write
// wire with omitempty on everything but scp.
func (k *Keys) appendClaims(b []byte, c Claims) []byte {
	b = append(b, '{')
	if k.issuer != "" {
		b = append(b, `"iss":`...)
		b = appendString(b, k.issuer)
		b = append(b, ',')
	}
	b = append(b, `"sub":"`+subjectPrefix...)
	b = strconv.AppendInt(b, c.JobID, 10)
	b = append(b, `","aud":"`+Audience+`","exp":`...)
	b = strconv.AppendInt(b, c.Expires.Unix(), 10)
	if !c.IssuedAt.IsZero() {
		b = append(b, `,"nbf":`...)
		b = strconv.AppendInt(b, c.IssuedAt.Add(-5*time.Second).Unix(), 10)
		b = append(b, `,"iat":`...)
		b = strconv.AppendInt(b, c.IssuedAt.Unix(), 10)
	}
	b = append(b, `,"jti":`...)
	b = appendString(b, c.HandOut)
	b = append(b, `,"version":"`+version+`"`...)
	for _, f := range []struct {
		name string
		v    int64
	}{{`,"c":"`, k.cell}, {`,"o":"`, c.Organization}, {`,"p":"`, c.ProjectID}} {
		if f.v > 0 {
			b = append(b, f.name...)
			b = strconv.AppendInt(b, f.v, 36)
			b = append(b, '"')
		}
	}
	b = append(b, `,"scp":`...)
	if c.Scopes == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i, s := range c.Scopes {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, string(s))
		}
		b = append(b, ']')
	}
	if len(c.Dependencies) > 0 {
		b = append(b, `,"dep":[`...)
		for i, d := range c.Dependencies {
			if i > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendInt(b, d, 10)
		}
		b = append(b, ']')
	}
	return append(b, '}')
}

// appendString appends s as a JSON string: as it is when it needs no
// escaping (the common case: URLs, ids, scopes), else as encoding/json
// writes it.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// Verify checks a job token's signature, audience, cell and expiry (at
// the clock's now) and returns its claims. It does not look at the job:
// the caller checks HandOutDigest(claims.HandOut) against the job's token
// digest and that the job is handed out.
func (k *Keys) Verify(ctx context.Context, tok string) (*Claims, error) {
	if !IsJWT(tok) {
		return nil, ErrInvalid
	}
	if err := k.ensure(ctx); err != nil {
		return nil, err
	}
	s := strings.TrimPrefix(tok, token.PrefixJob)
	dot, last := strings.IndexByte(s, '.'), strings.LastIndexByte(s, '.')
	key, ok := k.keyOf(ctx, s[:dot])
	if !ok {
		return nil, ErrInvalid
	}
	mac := hmac.New(sha256.New, key.Secret)
	mac.Write([]byte(s[:last]))
	var sig [44]byte
	want := base64.RawURLEncoding.AppendEncode(sig[:0], mac.Sum(nil))
	if subtle.ConstantTimeCompare(want, []byte(s[last+1:])) != 1 {
		return nil, ErrInvalid
	}
	raw, err := base64.RawURLEncoding.DecodeString(s[dot+1 : last])
	if err != nil {
		return nil, ErrInvalid
	}
	var w wire
	if err := decodeClaims(raw, &w); err != nil {
		return nil, ErrInvalid
	}
	if !strings.HasPrefix(w.Subject, subjectPrefix) || w.ID == "" || !slices.Contains(w.Audience, Audience) {
		return nil, ErrInvalid
	}
	id, err := strconv.ParseInt(strings.TrimPrefix(w.Subject, subjectPrefix), 10, 64)
	if err != nil || id <= 0 {
		return nil, ErrInvalid
	}
	c := &Claims{JobID: id, Scopes: w.Scopes, Dependencies: w.Deps, HandOut: w.ID}
	for _, f := range []struct {
		s   string
		dst *int64
	}{{w.Cell, &c.Cell}, {w.Org, &c.Organization}, {w.Project, &c.ProjectID}} {
		if f.s == "" {
			continue
		}
		if *f.dst, err = strconv.ParseInt(f.s, 36, 64); err != nil {
			return nil, ErrInvalid
		}
	}
	if c.Cell != k.cell {
		return nil, fmt.Errorf("%w: the token belongs to cell %d, this is cell %d", ErrInvalid, c.Cell, k.cell)
	}
	if w.IssuedAt != nil {
		c.IssuedAt = numericDate(*w.IssuedAt)
	}
	if w.Expiry == nil {
		return nil, ErrInvalid
	}
	c.Expires = numericDate(*w.Expiry)
	if !k.clock.Now().Before(c.Expires) {
		return nil, ErrExpired
	}
	return c, nil
}

// numericDate is the time of a JWT NumericDate, to the second.
func numericDate(f float64) time.Time { return time.Unix(int64(f), 0) }

// keyOf returns the key whose tokens carry header (headerOf), reading the
// store again (at most once a second) when it knows none: another replica
// rotated.
func (k *Keys) keyOf(ctx context.Context, header string) (key, bool) {
	for reloaded := false; ; reloaded = true {
		k.mu.Lock()
		for _, x := range k.keys {
			if x.header == header {
				k.mu.Unlock()
				return x, true
			}
		}
		due := time.Since(k.loaded) >= reloadEvery
		k.mu.Unlock()
		if reloaded || !due {
			return key{}, false
		}
		keys, err := load(ctx, k.st)
		if err != nil || len(keys) == 0 {
			return key{}, false
		}
		k.mu.Lock()
		k.keys, k.loaded = keys, time.Now()
		k.mu.Unlock()
	}
}

func base36(v int64) string {
	if v <= 0 {
		return ""
	}
	return strconv.FormatInt(v, 36)
}

// load reads the keys, oldest first.
func load(ctx context.Context, st store.Store) ([]key, error) {
	raw, err := st.GetSetting(ctx, SettingKeys)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("loading job token keys: %w", err)
	}
	var keys []key
	if err := json.Unmarshal([]byte(raw), &keys); err != nil {
		return nil, fmt.Errorf("job token keys in setting %s: %w", SettingKeys, err)
	}
	slices.SortStableFunc(keys, func(a, b key) int { return a.Created.Compare(b.Created) })
	for i := range keys {
		keys[i].header = headerOf(keys[i].KID)
	}
	return keys, nil
}

func save(ctx context.Context, st store.Store, keys []key) error {
	b, err := json.Marshal(keys)
	if err != nil {
		return err
	}
	return st.PutSetting(ctx, SettingKeys, string(b))
}

// Rotate adds a key that signs from now on; the older ones keep
// verifying. Running coordinators of the cell verify tokens it signed at
// once (an unknown key id makes them read the store) and sign with it
// within signReload.
func Rotate(ctx context.Context, st store.Store) (KeyInfo, error) {
	keys, err := load(ctx, st)
	if err != nil {
		return KeyInfo{}, err
	}
	// The id is the base64url of the secret's hash, drawn again when it
	// would begin with '-': an operator passes it to job-token-keys
	// remove, where it would read as a flag.
	secret := make([]byte, 32)
	var kid string
	for kid == "" || kid[0] == '-' {
		if _, err := rand.Read(secret); err != nil {
			return KeyInfo{}, err
		}
		sum := sha256.Sum256(secret)
		kid = base64.RawURLEncoding.EncodeToString(sum[:12])
	}
	created := time.Now().UTC()
	if n := len(keys); n > 0 && !created.After(keys[n-1].Created) {
		created = keys[n-1].Created.Add(time.Nanosecond)
	}
	k := key{KID: kid, Secret: secret, Created: created}
	if err := save(ctx, st, append(keys, k)); err != nil {
		return KeyInfo{}, err
	}
	return KeyInfo{KID: k.KID, Created: k.Created, Signing: true}, nil
}

// ErrSigningKey: the newest key signs; rotate before removing it.
var ErrSigningKey = errors.New("the newest key signs job tokens; rotate before removing it")

// ErrNoKey: no key has that id.
var ErrNoKey = errors.New("no such key")

// Remove deletes a key that no longer signs: tokens it signed stop
// verifying.
func Remove(ctx context.Context, st store.Store, kid string) error {
	keys, err := load(ctx, st)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(keys, func(k key) bool { return k.KID == kid })
	switch {
	case i < 0:
		return fmt.Errorf("job token key %s: %w", kid, ErrNoKey)
	case i == len(keys)-1:
		return ErrSigningKey
	}
	return save(ctx, st, slices.Delete(keys, i, i+1))
}

// List describes the keys, oldest first.
func List(ctx context.Context, st store.Store) ([]KeyInfo, error) {
	keys, err := load(ctx, st)
	if err != nil {
		return nil, err
	}
	out := make([]KeyInfo, len(keys))
	for i, k := range keys {
		out[i] = KeyInfo{KID: k.KID, Created: k.Created, Signing: i == len(keys)-1}
	}
	return out, nil
}
