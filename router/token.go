package router

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/berthci/berth/token"
)

// maxTokenLen bounds the tokens the router decodes: a routable token is
// at most ~330 characters, a job token JWT a few hundred more; anything
// much longer is not a token of ours and is not decoded.
const maxTokenLen = 8 << 10

// TokenRouting reads the routing a token carries, without checking that
// the token is valid (the cell does that):
//
//   - a routable token (glrt-…, glrtr-…, glpat-…, GR1348941…, any prefix,
//     layout v1 with its checksum): its routing payload, token.ParseRoutable;
//   - a job token JWT (glcbt-<header>.<payload>.<signature>, also after an
//     instance prefix, <prefix>-glcbt-…): the routing claims c, o, g, p, u
//     of its payload (base36 strings, gitlab-next.md §1.3); the signature
//     is not verified, the header not read.
//
// token.ErrNotRoutable (wrapped, saying why) for anything else. A
// routable token need not name a cell (Routing.Cell 0).
func TokenRouting(tok string) (token.Routing, error) {
	if len(tok) > maxTokenLen {
		return token.Routing{}, fmt.Errorf("token of %d bytes, longer than any routable one: %w", len(tok), token.ErrNotRoutable)
	}
	if jwt, ok := jobTokenJWT(tok); ok {
		return JobTokenRouting(jwt)
	}
	return token.ParseRoutable(tok)
}

// jobTokenJWT is the JWT of a job token: what follows glcbt- at the
// start, or after an instance prefix ending in "-", when it has the three
// segments of a JWT.
func jobTokenJWT(tok string) (string, bool) {
	rest, ok := strings.CutPrefix(tok, token.PrefixJob)
	if !ok {
		i := strings.Index(tok, "-"+token.PrefixJob)
		if i <= 0 || strings.IndexByte(tok[:i], '.') >= 0 {
			return "", false
		}
		rest = tok[i+1+len(token.PrefixJob):]
	}
	if strings.Count(rest, ".") != 2 {
		return "", false
	}
	return rest, true
}

// JobTokenRouting reads the routing claims of a JWT
// (<base64url header>.<base64url payload>.<signature>): "c" cell, "o"
// organization, "g" group, "p" project, "u" user, each a base36 string
// of a positive integer; absent claims are zero. Only the payload is
// decoded; nothing is verified. Errors wrap token.ErrNotRoutable and say
// what is wrong.
func JobTokenRouting(jwt string) (token.Routing, error) {
	var r token.Routing
	parts := strings.Split(jwt, ".")
	if len(parts) != 3 {
		return r, fmt.Errorf("job token: %d segments, a JWT has 3: %w", len(parts), token.ErrNotRoutable)
	}
	// JWTs are unpadded base64url (RFC 7515); tolerate padding.
	payload, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return r, fmt.Errorf("job token payload is not base64url (%v): %w", err, token.ErrNotRoutable)
	}
	var claims map[string]json.RawMessage
	if err := json.Unmarshal(payload, &claims); err != nil {
		return r, fmt.Errorf("job token payload is not a JSON object (%v): %w", err, token.ErrNotRoutable)
	}
	for _, c := range []struct {
		name string
		dst  *int64
	}{{"c", &r.Cell}, {"o", &r.Organization}, {"g", &r.Group}, {"p", &r.Project}, {"u", &r.User}} {
		raw, ok := claims[c.name]
		if !ok {
			continue
		}
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return token.Routing{}, fmt.Errorf("job token claim %q is %s, want a base36 string: %w", c.name, clip(raw), token.ErrNotRoutable)
		}
		v, ok := parse36(s)
		if !ok {
			return token.Routing{}, fmt.Errorf("job token claim %q is %q, want a positive integer in lower-case base36: %w", c.name, clip([]byte(s)), token.ErrNotRoutable)
		}
		*c.dst = v
	}
	return r, nil
}

// parse36 reads a positive integer written in lower-case base36, as
// GitLab writes routing values: digits and a-z only, no sign.
func parse36(s string) (int64, bool) {
	if s == "" {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'z') {
			return 0, false
		}
	}
	v, err := strconv.ParseInt(s, 36, 64)
	return v, err == nil && v > 0
}

// clip shortens outside input quoted in an error.
func clip(b []byte) string {
	const max = 40
	if len(b) > max {
		return string(b[:max]) + "…"
	}
	return string(b)
}
