// Package httpapi holds what the coordinator's HTTP APIs (the Runner API
// and the REST API) answer alike: GitLab's JSON bodies and error shape,
// bounded request bodies, path ids and timestamps.
package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/berthci/berth/runnerapi"
)

// MaxJSONBody bounds JSON request bodies.
const MaxJSONBody = 1 << 20

// DecodeJSON reads a JSON body into v, answering 400 (or 413) itself on
// failure.
func DecodeJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	buf := getBuffer()
	defer putBuffer(buf)
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, MaxJSONBody))
	if err == nil {
		// One JSON value and nothing after it but blanks:
		// {"token":"x"}garbage is not a body (Unmarshal refuses it).
		err = json.Unmarshal(buf.Bytes(), v)
	}
	if err != nil {
		if TooLarge(w, err) {
			return false
		}
		WriteError(w, http.StatusBadRequest, "400 Bad request - invalid JSON body: "+err.Error())
		return false
	}
	return true
}

// bodyBuffers keeps the buffers of bodies read and written between
// requests (Unmarshal copies what it keeps), those up to maxPooledBody.
var bodyBuffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

const maxPooledBody = 64 << 10

// getBuffer is an empty buffer from bodyBuffers; putBuffer gives it back.
func getBuffer() *bytes.Buffer {
	buf := bodyBuffers.Get().(*bytes.Buffer)
	buf.Reset()
	return buf
}

func putBuffer(buf *bytes.Buffer) {
	if buf.Cap() <= maxPooledBody {
		bodyBuffers.Put(buf)
	}
}

// TooLarge answers 413 when err comes from a body over its limit.
func TooLarge(w http.ResponseWriter, err error) bool {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		WriteError(w, http.StatusRequestEntityTooLarge, "413 Request Entity Too Large")
		return true
	}
	return false
}

// WriteJSON answers code with v as JSON, with its Content-Length: a body
// over net/http's 2 KiB buffer (a job's payload) is otherwise sent
// chunked, which both ends then frame and unframe.
func WriteJSON(w http.ResponseWriter, code int, v any) {
	buf := getBuffer()
	defer putBuffer(buf)
	if err := json.NewEncoder(buf).Encode(v); err != nil {
		// A value that does not encode is the coordinator's bug: say so
		// rather than send half a body.
		slog.Error("encoding a JSON answer", "err", err)
		WriteError(w, http.StatusInternalServerError, "500 Internal Server Error")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(buf.Len()))
	w.WriteHeader(code)
	_, _ = w.Write(buf.Bytes())
}

// WriteError writes GitLab's error body {"message": ...}.
func WriteError(w http.ResponseWriter, code int, msg string) {
	WriteJSON(w, code, runnerapi.ErrorResponse{Message: msg})
}

// InternalError logs what failed and answers 500 without details.
func InternalError(log *slog.Logger, w http.ResponseWriter, what string, err error) {
	log.Error(what, "err", err)
	WriteError(w, http.StatusInternalServerError, "500 Internal Server Error")
}

// PathID parses a numeric path value; it answers 404 itself when invalid.
func PathID(w http.ResponseWriter, r *http.Request, name string) (int64, bool) {
	id, err := strconv.ParseInt(r.PathValue(name), 10, 64)
	if err != nil || id <= 0 {
		WriteError(w, http.StatusNotFound, "404 Not Found")
		return 0, false
	}
	return id, true
}

// ReadLimited reads a whole body of at most max bytes.
func ReadLimited(r *http.Request, max int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r.Body, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, errors.New("body too large")
	}
	return b, nil
}

// Page is the slice [From, To) of a list that a request's page and
// per_page select.
type Page struct{ From, To int }

// Paginate applies page (from 1) and per_page (default 20, at most 100)
// to a list of n items and sets GitLab's pagination headers; it answers
// 400 itself for a bad value.
func Paginate(w http.ResponseWriter, r *http.Request, n int) (Page, bool) {
	q := r.URL.Query()
	num, per := 1, 20
	for name, dst := range map[string]*int{"page": &num, "per_page": &per} {
		if v := q.Get(name); v != "" {
			x, err := strconv.Atoi(v)
			if err != nil || x < 1 {
				WriteError(w, http.StatusBadRequest, "400 Bad request - "+name+" is invalid")
				return Page{}, false
			}
			*dst = x
		}
	}
	per = min(per, 100)
	// A page past the end is empty; (num-1)*per is only computed when it
	// cannot overflow (page=9223372036854775807 once wrapped to page 1).
	from := n
	if num-1 <= n/per {
		from = min((num-1)*per, n)
	}
	to := min(from+per, n)
	h := w.Header()
	h.Set("X-Page", strconv.Itoa(num))
	h.Set("X-Per-Page", strconv.Itoa(per))
	h.Set("X-Total", strconv.Itoa(n))
	h.Set("X-Total-Pages", strconv.Itoa(max(1, (n+per-1)/per)))
	if to < n {
		h.Set("X-Next-Page", strconv.Itoa(num+1))
	} else {
		h.Set("X-Next-Page", "")
	}
	return Page{from, to}, true
}

// RFC3339OrNil formats t for a JSON body: null when zero.
func RFC3339OrNil(t time.Time) *string {
	if t.IsZero() {
		return nil
	}
	s := t.UTC().Format(time.RFC3339)
	return &s
}

// OrEmpty returns v, or an empty slice for nil (a JSON [] instead of
// null).
func OrEmpty[T any](v []T) []T {
	if v == nil {
		return []T{}
	}
	return v
}

// BoolOr is *b, or def when the body left b out.
func BoolOr(b *bool, def bool) bool {
	if b == nil {
		return def
	}
	return *b
}
