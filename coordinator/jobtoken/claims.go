package jobtoken

import (
	"encoding/json"
	"strconv"
)

// decodeClaims reads a token's claims (after its signature verified).
// Claims as Mint writes them — no blanks, strings without escapes, whole
// numbers, the names of wire — take a direct path; anything else goes to
// encoding/json, whose result the direct path matches exactly where it
// answers (FuzzDecodeClaims). On the dispatch path every acknowledgement,
// update and log chunk of a job verifies its token, and encoding/json was
// three quarters of a verification.
func decodeClaims(raw []byte, w *wire) error {
	if fastClaims(raw, w) {
		return nil
	}
	*w = wire{}
	return json.Unmarshal(raw, w)
}

// fastClaims parses raw into w and reports whether it could; w may be
// partly written when it could not.
func fastClaims(raw []byte, w *wire) bool {
	p := claimsParser{b: raw}
	if !p.byte('{') {
		return false
	}
	if p.byte('}') {
		return p.i == len(p.b)
	}
	for {
		name, ok := p.str()
		if !ok || !p.byte(':') {
			return false
		}
		switch name {
		case "iss":
			ok = p.strInto(&w.Issuer)
		case "sub":
			ok = p.strInto(&w.Subject)
		case "aud":
			var s string
			if ok = p.strInto(&s); ok {
				w.Audience = audience{s}
			}
		case "exp":
			w.Expiry, ok = p.date()
		case "nbf":
			w.NotBefore, ok = p.date()
		case "iat":
			w.IssuedAt, ok = p.date()
		case "jti":
			ok = p.strInto(&w.ID)
		case "version":
			ok = p.strInto(&w.Version)
		case "c":
			ok = p.strInto(&w.Cell)
		case "o":
			ok = p.strInto(&w.Org)
		case "p":
			ok = p.strInto(&w.Project)
		case "scp":
			w.Scopes, ok = p.scopes()
		case "dep":
			w.Deps, ok = p.ints()
		default:
			return false // encoding/json matches names loosely: let it
		}
		if !ok {
			return false
		}
		if p.byte('}') {
			return p.i == len(p.b)
		}
		if !p.byte(',') {
			return false
		}
	}
}

type claimsParser struct {
	b []byte
	i int
}

func (p *claimsParser) byte(c byte) bool {
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

// str reads a string of printable ASCII without escapes.
func (p *claimsParser) str() (string, bool) {
	if !p.byte('"') {
		return "", false
	}
	start := p.i
	for ; p.i < len(p.b); p.i++ {
		switch c := p.b[p.i]; {
		case c == '"':
			s := string(p.b[start:p.i])
			p.i++
			return s, true
		case c < 0x20 || c > 0x7e || c == '\\':
			return "", false
		}
	}
	return "", false
}

func (p *claimsParser) strInto(dst *string) bool {
	s, ok := p.str()
	if ok {
		*dst = s
	}
	return ok
}

// int reads a JSON integer of at most 15 digits (exact as a float64 and
// as an int64).
func (p *claimsParser) int() (int64, bool) {
	start := p.i
	p.byte('-')
	digits := p.i
	for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
		p.i++
	}
	n := p.i - digits
	if n == 0 || n > 15 || (n > 1 && p.b[digits] == '0') {
		return 0, false
	}
	if p.i < len(p.b) {
		if c := p.b[p.i]; c == '.' || c == 'e' || c == 'E' {
			return 0, false
		}
	}
	v, err := strconv.ParseInt(string(p.b[start:p.i]), 10, 64)
	return v, err == nil
}

func (p *claimsParser) date() (*float64, bool) {
	v, ok := p.int()
	if !ok {
		return nil, false
	}
	f := float64(v)
	return &f, true
}

// scopes reads null or an array of strings.
func (p *claimsParser) scopes() ([]Scope, bool) {
	if p.literal("null") {
		return nil, true
	}
	return array(p, func() (Scope, bool) {
		v, ok := p.str()
		return Scope(v), ok
	})
}

// ints reads an array of integers (not null: Mint leaves dep out instead).
func (p *claimsParser) ints() ([]int64, bool) { return array(p, p.int) }

// array reads [elem, …] (an empty array is an empty, non-nil slice, as
// encoding/json makes it).
func array[T any](p *claimsParser, elem func() (T, bool)) ([]T, bool) {
	if !p.byte('[') {
		return nil, false
	}
	s := []T{}
	if p.byte(']') {
		return s, true
	}
	for {
		v, ok := elem()
		if !ok {
			return nil, false
		}
		s = append(s, v)
		if p.byte(']') {
			return s, true
		}
		if !p.byte(',') {
			return nil, false
		}
	}
}

func (p *claimsParser) literal(s string) bool {
	if len(p.b)-p.i >= len(s) && string(p.b[p.i:p.i+len(s)]) == s {
		p.i += len(s)
		return true
	}
	return false
}
