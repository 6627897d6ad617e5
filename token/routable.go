package token

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"hash/crc32"
	"strconv"
	"strings"
)

// Routable tokens (GitLab Cells, layout v1): a token that says which cell
// (and organization, group, project, user) it belongs to, so that a
// router finds the cell without a database. The layout is GitLab's
// (reference: gitlab-next.md §1.2):
//
//	<prefix><base64url(random16 ‖ payload ‖ byte(len(payload)))>.01.<LL><CCCCCCC>
//
// payload is "k:v" lines, keys sorted, values in base36; LL is the length
// of the base64 part in base36 (2 characters), CCCCCCC the CRC-32 (IEEE)
// of everything before it, base36 (7 characters). The routing part is
// not secret and not authenticated: a token is still checked whole
// against its stored digest, so a tampered payload only misroutes.

// Routing is the routing payload of a routable token. Zero fields are
// absent.
type Routing struct {
	Cell         int64 // c
	Organization int64 // o
	Group        int64 // g
	Project      int64 // p
	User         int64 // u
	RunnerType   int64 // t (reserved by GitLab)
}

// RoutableVersion is the token layout version Berth writes and reads.
const RoutableVersion = "01"

// Limits of the layout.
const (
	routableRandom     = 16
	maxRoutingPayload  = 159
	routableCRCLen     = 7
	routableLengthLen  = 2
	minRoutableBase64  = 27
	maxRoutableBase64  = 300
	routableVersionSep = "." + RoutableVersion + "."
)

// ErrNotRoutable: the string is not a routable token of layout v1 (or
// its checksum does not match).
var ErrNotRoutable = errors.New("not a routable token")

func (r Routing) pairs() [][2]string {
	var out [][2]string
	for _, kv := range []struct {
		k string
		v int64
	}{{"c", r.Cell}, {"g", r.Group}, {"o", r.Organization}, {"p", r.Project}, {"t", r.RunnerType}, {"u", r.User}} {
		if kv.v > 0 {
			out = append(out, [2]string{kv.k, strconv.FormatInt(kv.v, 36)})
		}
	}
	return out // keys in alphabetical order already
}

// payload is the routing payload: "k:v" lines, keys sorted.
func (r Routing) payload() []byte {
	var lines []string
	for _, p := range r.pairs() {
		lines = append(lines, p[0]+":"+p[1])
	}
	return []byte(strings.Join(lines, "\n"))
}

// NewRoutable mints a token of the given prefix (such as "glrt-t1_")
// carrying r, with 16 random bytes. r must name something (GitLab always
// writes the organization).
func NewRoutable(prefix string, r Routing) (string, error) {
	rnd := make([]byte, routableRandom)
	randomBytes(rnd)
	return encodeRoutable(prefix, rnd, r)
}

func encodeRoutable(prefix string, rnd []byte, r Routing) (string, error) {
	p := r.payload()
	if len(p) == 0 {
		return "", errors.New("a routable token needs routing: a cell or an organization at least")
	}
	if len(p) > maxRoutingPayload {
		return "", fmt.Errorf("routing payload of %d bytes: at most %d", len(p), maxRoutingPayload)
	}
	raw := make([]byte, 0, len(rnd)+len(p)+1)
	raw = append(raw, rnd...)
	raw = append(raw, p...)
	raw = append(raw, byte(len(p)))
	b64 := base64.RawURLEncoding.EncodeToString(raw)
	s := prefix + b64 + routableVersionSep + pad36(int64(len(b64)), routableLengthLen)
	return s + pad36(int64(crc32.ChecksumIEEE([]byte(s))), routableCRCLen), nil
}

// ParseRoutable reads the routing payload of a routable token, checking
// its layout and checksum (not its authenticity: only the store's digest
// says a token is valid). ErrNotRoutable for anything else, such as a
// token minted before routing existed.
func ParseRoutable(tok string) (Routing, error) {
	var r Routing
	if len(tok) <= routableCRCLen {
		return r, ErrNotRoutable
	}
	// Every number is compared in its one canonical spelling (lower-case
	// base 36, zero-padded): strconv would also take "A" for "a", and an
	// altered token must not parse.
	body, sum := tok[:len(tok)-routableCRCLen], tok[len(tok)-routableCRCLen:]
	if sum != pad36(int64(crc32.ChecksumIEEE([]byte(body))), routableCRCLen) {
		return r, ErrNotRoutable
	}
	i := strings.LastIndex(body, routableVersionSep)
	if i < 0 || len(body)-i-len(routableVersionSep) != routableLengthLen {
		return r, ErrNotRoutable
	}
	n, err := strconv.ParseInt(body[len(body)-routableLengthLen:], 36, 64)
	head := body[:i]
	if err != nil || body[len(body)-routableLengthLen:] != pad36(n, routableLengthLen) || n < minRoutableBase64 || n > maxRoutableBase64 || int64(len(head)) < n {
		return r, ErrNotRoutable
	}
	raw, err := base64.RawURLEncoding.DecodeString(head[int64(len(head))-n:])
	if err != nil || len(raw) < routableRandom+1 {
		return r, ErrNotRoutable
	}
	p := raw[routableRandom : len(raw)-1]
	if int(raw[len(raw)-1]) != len(p) {
		return r, ErrNotRoutable
	}
	for _, line := range bytes.Split(p, []byte("\n")) {
		k, v, ok := bytes.Cut(line, []byte(":"))
		if !ok || len(k) != 1 {
			return Routing{}, ErrNotRoutable
		}
		x, err := strconv.ParseInt(string(v), 36, 64)
		if err != nil || x <= 0 || strconv.FormatInt(x, 36) != string(v) {
			return Routing{}, ErrNotRoutable
		}
		switch k[0] {
		case 'c':
			r.Cell = x
		case 'o':
			r.Organization = x
		case 'g':
			r.Group = x
		case 'p':
			r.Project = x
		case 'u':
			r.User = x
		case 't':
			r.RunnerType = x
		default:
			return Routing{}, ErrNotRoutable
		}
	}
	if r == (Routing{}) {
		return r, ErrNotRoutable
	}
	return r, nil
}

// pad36 is v in base36, left-padded with 0 to width.
func pad36(v int64, width int) string {
	s := strconv.FormatInt(v, 36)
	if len(s) < width {
		s = strings.Repeat("0", width-len(s)) + s
	}
	return s
}
