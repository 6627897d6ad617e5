package router

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/berthci/berth/token"
)

// HeaderCell names the cell of a request whose token does not (the admin
// CLI's --cell); the router also sets it on every proxied response to the
// cell that answered.
const HeaderCell = "X-Berth-Cell"

// Source is what decided a request's cell. Its values are the "by" label
// of the router's metrics.
type Source string

// Sources, in the order the router looks (docs/cells.md, "The router").
const (
	ByRunnerToken  Source = "runner_token"        // RUNNER-TOKEN header
	ByJobToken     Source = "job_token"           // JOB-TOKEN header
	ByPrivateToken Source = "private_token"       // PRIVATE-TOKEN header
	ByBearer       Source = "bearer"              // Authorization: Bearer
	ByBasic        Source = "basic"               // Authorization: Basic, the password
	ByQueryJob     Source = "query_job_token"     // ?job_token=
	ByQueryToken   Source = "query_token"         // ?token=
	ByQueryPrivate Source = "query_private_token" // ?private_token=
	ByBody         Source = "body"                // "token" of a runner endpoint's JSON body
	ByCellHeader   Source = "cell_header"         // X-Berth-Cell
	ByDefault      Source = "default"             // the default cell
)

// Decision is where a request goes.
type Decision struct {
	// Cell is the cell the request goes to.
	Cell int64
	// By is what decided it.
	By Source
	// Token is the token the router found (or "" when none): for
	// token.Short in logs, never to be logged whole.
	Token string
	// TokenSource is where Token was found. It differs from By when the
	// token named no cell.
	TokenSource Source
}

// Errors a request can be refused with, wrapped in a *RouteError.
var (
	// ErrUnknownCell: the token or X-Berth-Cell names a cell this router
	// does not serve.
	ErrUnknownCell = errors.New("unknown cell")
	// ErrNoCell: nothing names a cell and there is no default cell.
	ErrNoCell = errors.New("no cell")
	// ErrBadCellHeader: X-Berth-Cell is not a cell id.
	ErrBadCellHeader = errors.New("bad X-Berth-Cell header")
)

// RouteError is a request the router refuses, with the status it answers
// and GitLab's error message ("421 Misdirected Request - …").
type RouteError struct {
	Status int
	// Detail says what is wrong, without any token.
	Detail string
	Err    error
}

func (e *RouteError) Error() string { return e.Message() }
func (e *RouteError) Unwrap() error { return e.Err }

// Message is the error body's message, GitLab style.
func (e *RouteError) Message() string {
	return strconv.Itoa(e.Status) + " " + http.StatusText(e.Status) + " - " + e.Detail
}

// Route decides the cell of a request (docs/cells.md, "The router"):
//
//  1. the first token found, in this order: the headers RUNNER-TOKEN,
//     JOB-TOKEN, PRIVATE-TOKEN, Authorization: Bearer, the password of
//     Authorization: Basic; on the endpoints whose body carries it
//     (bodyTokenEndpoint), the body's "token"; the query parameters
//     job_token, token, private_token;
//  2. if that token names a cell (TokenRouting): that cell, or
//     ErrUnknownCell when this router does not serve it;
//  3. else X-Berth-Cell, if present: that cell (ErrBadCellHeader,
//     ErrUnknownCell);
//  4. else the default cell, or ErrNoCell.
//
// Reading the body's token replaces r.Body with one that reads the same
// bytes: what was read, then the rest, unbuffered. Errors are
// *RouteError.
func (rt *Router) Route(r *http.Request) (Decision, error) {
	tok, src := requestToken(r, rt.cfg.MaxBodyPeek)
	d := Decision{Token: tok, TokenSource: src}
	if tok != "" {
		if rr, err := TokenRouting(tok); err == nil && rr.Cell > 0 {
			if _, ok := rt.cells[rr.Cell]; !ok {
				return d, &RouteError{Status: http.StatusMisdirectedRequest, Err: ErrUnknownCell,
					Detail: fmt.Sprintf("the token belongs to cell %d, which this router does not serve", rr.Cell)}
			}
			d.Cell, d.By = rr.Cell, src
			return d, nil
		}
	}
	if h := r.Header.Get(HeaderCell); h != "" {
		id, err := strconv.ParseInt(strings.TrimSpace(h), 10, 64)
		if err != nil || id <= 0 {
			return d, &RouteError{Status: http.StatusBadRequest, Err: ErrBadCellHeader,
				Detail: fmt.Sprintf("%s %q is not a cell id (a positive integer)", HeaderCell, clip([]byte(h)))}
		}
		if _, ok := rt.cells[id]; !ok {
			return d, &RouteError{Status: http.StatusMisdirectedRequest, Err: ErrUnknownCell,
				Detail: fmt.Sprintf("%s names cell %d, which this router does not serve", HeaderCell, id)}
		}
		d.Cell, d.By = id, ByCellHeader
		return d, nil
	}
	if rt.cfg.DefaultCell > 0 {
		d.Cell, d.By = rt.cfg.DefaultCell, ByDefault
		return d, nil
	}
	if tok == "" {
		// No credentials at all: ask for them. A git client sends its
		// first request without any and its credentials only after a 401
		// (their token then names the cell).
		return d, &RouteError{Status: http.StatusUnauthorized, Err: ErrNoCell,
			Detail: "the request has no token, and this router has no default cell to send it to"}
	}
	return d, &RouteError{Status: http.StatusMisdirectedRequest, Err: ErrNoCell,
		Detail: "the token names no cell, and this router has no default cell"}
}

// requestToken is the first token of r in Route's order, and where it
// was found; "" when there is none.
func requestToken(r *http.Request, maxPeek int64) (string, Source) {
	for _, h := range []struct {
		name string
		src  Source
	}{{"RUNNER-TOKEN", ByRunnerToken}, {"JOB-TOKEN", ByJobToken}, {"PRIVATE-TOKEN", ByPrivateToken}} {
		if t := r.Header.Get(h.name); t != "" {
			return t, h.src
		}
	}
	if a := r.Header.Get("Authorization"); a != "" {
		// Schemes are case-insensitive (RFC 9110 §11.1).
		if len(a) > 7 && strings.EqualFold(a[:7], "Bearer ") {
			if t := strings.TrimSpace(a[7:]); t != "" {
				return t, ByBearer
			}
		} else if _, pass, ok := r.BasicAuth(); ok && pass != "" {
			return pass, ByBasic
		}
	}
	// On the endpoints whose body carries the token, the body's comes
	// before the query's, as the cell reads them (GitLab's params: a
	// body's field wins over the query's of the same name).
	if maxPeek > 0 && bodyTokenEndpoint(r) {
		if t := peekBodyToken(r, maxPeek); t != "" {
			return t, ByBody
		}
	}
	if r.URL.RawQuery != "" {
		q := r.URL.Query()
		for _, p := range []struct {
			name string
			src  Source
		}{{"job_token", ByQueryJob}, {"token", ByQueryToken}, {"private_token", ByQueryPrivate}} {
			if t := q.Get(p.name); t != "" {
				return t, p.src
			}
		}
	}
	return "", ""
}

// bodyTokenEndpoint says whether r is one of the requests whose token
// travels in the body: the Runner API's, in JSON (gitlab-runner sends it
// there; newer runners send the RUNNER-TOKEN header too), and the
// pipeline trigger API's, in a form or JSON (curl --form token=…):
//
//	POST   /api/v4/runners                              register
//	DELETE /api/v4/runners                              unregister
//	POST   /api/v4/runners/verify
//	DELETE /api/v4/runners/managers
//	POST   /api/v4/runners/reset_authentication_token
//	POST   /api/v4/jobs/request                         the long poll
//	PUT    /api/v4/jobs/:id                             job update
//	POST   /api/v4/projects/:id/[ref/:ref/]trigger/pipeline
//
// Nothing else is read: trace PATCHes and artifact uploads carry
// JOB-TOKEN and are never buffered.
func bodyTokenEndpoint(r *http.Request) bool {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return false
	}
	if ce := r.Header.Get("Content-Encoding"); ce != "" && !strings.EqualFold(ce, "identity") {
		return false
	}
	p := r.URL.Path
	switch r.Method {
	case http.MethodPost:
		return p == "/api/v4/runners" || p == "/api/v4/runners/verify" ||
			p == "/api/v4/runners/reset_authentication_token" || p == "/api/v4/jobs/request" ||
			strings.HasPrefix(p, "/api/v4/projects/") && strings.HasSuffix(p, "/trigger/pipeline")
	case http.MethodDelete:
		return p == "/api/v4/runners" || p == "/api/v4/runners/managers"
	case http.MethodPut:
		id, ok := strings.CutPrefix(p, "/api/v4/jobs/")
		return ok && id != "" && strings.Trim(id, "0123456789") == ""
	}
	return false
}

// peekBodyToken reads at most max bytes of r's body, finds its "token"
// (bodyToken), and puts back a body that reads what was read and then
// the rest.
func peekBodyToken(r *http.Request, max int64) string {
	n := max
	if r.ContentLength > 0 && r.ContentLength < n {
		n = r.ContentLength
	}
	buf := make([]byte, n)
	got, err := io.ReadFull(r.Body, buf)
	buf = buf[:got]
	rest := r.Body
	if err != nil {
		// The body ended (or failed) within the prefix: what was read is
		// all of it; a failure reaches the cell as a short body, which
		// it refuses.
		rest = http.NoBody
	}
	r.Body = &peekedBody{Reader: io.MultiReader(bytes.NewReader(buf), rest), body: r.Body}
	whole := err != nil || r.ContentLength > 0 && int64(got) == r.ContentLength
	return requestBodyToken(r.Header.Get("Content-Type"), buf, whole)
}

// requestBodyToken is the token of a body (or of its first bytes, when
// whole is false) as the coordinator reads the body's content type: the
// token field of a URL-encoded or multipart form, else bodyToken.
func requestBodyToken(ctype string, b []byte, whole bool) string {
	mt, params, _ := mime.ParseMediaType(ctype)
	switch mt {
	case "application/x-www-form-urlencoded":
		if !whole {
			// The last field may be cut short: only whole ones count.
			i := bytes.LastIndexByte(b, '&')
			if i < 0 {
				return ""
			}
			b = b[:i]
		}
		v, _ := url.ParseQuery(string(b)) // what parses, as the coordinator's ParseForm would fail on the rest
		return v.Get("token")
	case "multipart/form-data":
		mr := multipart.NewReader(bytes.NewReader(b), params["boundary"])
		for {
			part, err := mr.NextPart()
			if err != nil {
				return ""
			}
			if part.FormName() == "token" {
				v, err := io.ReadAll(part)
				if err != nil {
					return "" // cut short
				}
				return string(v)
			}
		}
	}
	return bodyToken(b)
}

// peekedBody is a body whose first bytes were read already.
type peekedBody struct {
	io.Reader
	body io.ReadCloser
}

func (b *peekedBody) Close() error { return b.body.Close() }

// bodyToken is the value of the "token" member of the JSON object that
// b is (or starts with: b may be a prefix), as encoding/json reads it
// into the coordinator's request structs: the last member whose name
// equals "token" case-insensitively and whose value is a string. "" if
// there is none (or b is not a JSON object).
func bodyToken(b []byte) string {
	// A whole body: encoding/json itself (the fast path, ~6x the
	// token-by-token scan).
	var v struct {
		Token string `json:"token"`
	}
	if json.Unmarshal(b, &v) == nil {
		return v.Token
	}
	return prefixToken(b)
}

// prefixToken is bodyToken of a prefix of a JSON object (or of a body
// that is not valid JSON), scanned token by token up to where it ends.
func prefixToken(b []byte) string {
	dec := json.NewDecoder(bytes.NewReader(b))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return ""
	}
	found := ""
	for {
		k, err := dec.Token()
		if err != nil {
			return found
		}
		key, ok := k.(string)
		if !ok { // '}': the end of the object
			return found
		}
		v, err := dec.Token()
		if err != nil {
			return found
		}
		switch v := v.(type) {
		case string:
			if strings.EqualFold(key, "token") {
				found = v
			}
		case json.Delim: // an object or array: skip it
			for depth := 1; depth > 0; {
				t, err := dec.Token()
				if err != nil {
					return found
				}
				if d, ok := t.(json.Delim); ok {
					if d == '{' || d == '[' {
						depth++
					} else {
						depth--
					}
				}
			}
		}
	}
}

// tokenLog is what logs may show of a token: its short form.
func tokenLog(tok string) string {
	if tok == "" {
		return ""
	}
	return token.Short(tok)
}
