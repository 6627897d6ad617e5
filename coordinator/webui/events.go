package webui

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/berthci/berth/coordinator/store"
)

// Live updates are server-sent events. A page that changes opens one
// stream: a pipeline's page hears "changed" when a job's or the
// pipeline's status changed (not for every line of a log) and refetches
// its live part; a job's log hears its new lines as ops (logrender.go),
// "status" when the job's status changed and "end" once the job is
// finished and its log sent; the runners and fleet pages hear "tick"
// every RefreshInterval. A stream sends a comment every 20 s so proxies
// keep it open, and ends with the UI.

const (
	keepAlive = 20 * time.Second
	// minEventGap spaces a pipeline's "changed" events.
	minEventGap = time.Second
	// logChunk bounds the log bytes of one "log" event.
	logChunk = 256 << 10
)

type sse struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

// startSSE answers with an event stream; false if the writer cannot
// stream (answered 500).
func startSSE(w http.ResponseWriter) (*sse, bool) {
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	if err := rc.Flush(); err != nil {
		return nil, false
	}
	_ = rc.SetWriteDeadline(time.Time{}) // a stream outlives any write timeout
	return &sse{w: w, rc: rc}, true
}

// send writes one event; data may hold newlines.
func (s *sse) send(event, data string) error {
	var b strings.Builder
	if event != "" {
		b.WriteString("event: " + event + "\n")
	}
	for _, line := range strings.Split(data, "\n") {
		b.WriteString("data: " + line + "\n")
	}
	b.WriteString("\n")
	if _, err := s.w.Write([]byte(b.String())); err != nil {
		return err
	}
	return s.rc.Flush()
}

func (s *sse) comment() error {
	if _, err := s.w.Write([]byte(": keep-alive\n\n")); err != nil {
		return err
	}
	return s.rc.Flush()
}

// handlePipelineEvents streams "changed" when what the pipeline's page
// shows changed since the version it was rendered at (?v=).
func (u *UI) handlePipelineEvents(w http.ResponseWriter, r *http.Request, pl *store.Pipeline) {
	ctx := r.Context()
	last := r.URL.Query().Get("v")
	if len(last) > 32 {
		last = ""
	}
	s, ok := startSSE(w)
	if !ok {
		return
	}
	for {
		changed := u.opts.Pipelines.PipelineChanged(pl.ID)
		st, err := u.opts.Pipelines.PipelineState(ctx, pl.ID)
		if err != nil {
			if ctx.Err() == nil {
				u.log.Warn("pipeline events: reading the pipeline", "pipeline_id", pl.ID, "err", err)
			}
			return
		}
		if v := fingerprint(st); v != last {
			last = v
			if s.send("changed", v) != nil {
				return
			}
		}
		ka := time.NewTimer(keepAlive)
		select {
		case <-changed:
		case <-ka.C:
			if s.comment() != nil {
				return
			}
		case <-ctx.Done():
			ka.Stop()
			return
		case <-u.stop:
			ka.Stop()
			return
		}
		ka.Stop()
		// Changes in quick succession become one event.
		select {
		case <-time.After(minEventGap):
		case <-ctx.Done():
			return
		case <-u.stop:
			return
		}
	}
}

type logEvent struct {
	Ops    []logOp `json:"ops"`
	Offset int64   `json:"offset"`
}

// handleLogEvents streams a job's log from ?offset= on: "log" events of
// ops as it grows, "status" when the job's status changes, "end" when the
// job is finished and its log sent. ?from= is where the page's rendering
// of the log began: the stream renders from there to offset unseen, so
// that colours and open sections carry on.
func (u *UI) handleLogEvents(w http.ResponseWriter, r *http.Request, j *store.Job) {
	ctx := r.Context()
	if u.refuseLog(w, r, j) {
		return
	}
	from, offset, err := parseLogRange(r.URL.Query().Get("from"), r.URL.Query().Get("offset"))
	if err != nil {
		http.Error(w, "400 Bad Request: "+err.Error(), http.StatusBadRequest)
		return
	}
	ti, err := u.st.TraceInfo(ctx, j.ID)
	if err != nil {
		u.log.Error("log events: trace info", "job_id", j.ID, "err", err)
		http.Error(w, "500 Internal Server Error", http.StatusInternalServerError)
		return
	}
	if offset > ti.Size {
		http.Error(w, "416 offset past the log's end", http.StatusRequestedRangeNotSatisfiable)
		return
	}
	lr := newLogRenderer(from == 0)
	if offset-from > 4*logWindow {
		lr, from = newLogRenderer(false), offset
	}
	if offset > from {
		cw := &cappedWriter{max: int(offset - from)}
		if _, err := u.opts.Logs.Read(ctx, j.ID, from, cw); err != nil && !errors.Is(err, errFull) {
			u.log.Error("log events: reading the log", "job_id", j.ID, "err", err)
			http.Error(w, "500 Internal Server Error", http.StatusInternalServerError)
			return
		}
		lr.Write(cw.buf.Bytes())
		lr.partial = lr.partial[:0] // the stream goes on from offset: a line's start
	}
	s, ok := startSSE(w)
	if !ok {
		return
	}
	status := j.Status
	lastSent := time.Now()
	for {
		var changed <-chan struct{}
		if j.PipelineID != 0 {
			changed = u.opts.Pipelines.PipelineChanged(j.PipelineID)
		}
		cur, err := u.st.GetJob(ctx, j.ID)
		if err != nil {
			return
		}
		if cur.DebugTrace && !j.DebugTrace {
			// The runner said the log is a debug trace after the stream
			// began: it goes on only for those who may read one.
			if may, err := u.mayReadLog(r, cur); err != nil || !may {
				return
			}
			j = cur
		}
		cw := &cappedWriter{max: logChunk}
		_, err = u.opts.Logs.Read(ctx, j.ID, offset, cw)
		var re *store.RangeError
		if err != nil && !errors.Is(err, errFull) && !errors.As(err, &re) {
			if ctx.Err() == nil {
				u.log.Warn("log events: reading the log", "job_id", j.ID, "err", err)
			}
			return
		}
		data := cw.buf.Bytes()
		offset += int64(len(data))
		ops := lr.Write(data)
		more := errors.Is(err, errFull)
		done := cur.Status.Finished() && !more
		if done {
			ops = append(ops, lr.Flush()...)
		}
		if len(ops) > 0 {
			b, _ := json.Marshal(logEvent{Ops: ops, Offset: offset})
			if s.send("log", string(b)) != nil {
				return
			}
			lastSent = time.Now()
		}
		if cur.Status != status {
			status = cur.Status
			if s.send("status", string(status)) != nil {
				return
			}
		}
		if done {
			_ = s.send("end", strconv.FormatInt(offset, 10))
			return
		}
		if more {
			continue
		}
		if time.Since(lastSent) > keepAlive {
			if s.comment() != nil {
				return
			}
			lastSent = time.Now()
		}
		// A pipeline's watchers are woken when a log grows; a job
		// outside pipelines is looked at every second.
		t := time.NewTimer(time.Second)
		if changed != nil {
			t.Reset(5 * time.Second)
		}
		select {
		case <-changed:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return
		case <-u.stop:
			t.Stop()
			return
		}
		t.Stop()
	}
}

// parseLogRange reads a log stream's from and offset: byte positions,
// 0 <= from <= offset.
func parseLogRange(fromS, offsetS string) (from, offset int64, err error) {
	parse := func(s string) (int64, error) {
		if s == "" {
			return 0, nil
		}
		if len(s) > 15 {
			return 0, errors.New("too large")
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 {
			return 0, errors.New("not a byte offset")
		}
		return n, nil
	}
	if from, err = parse(fromS); err != nil {
		return 0, 0, fmt.Errorf("from: %w", err)
	}
	if offset, err = parse(offsetS); err != nil {
		return 0, 0, fmt.Errorf("offset: %w", err)
	}
	if from > offset {
		return 0, 0, errors.New("from is past offset")
	}
	return from, offset, nil
}

// handleTicks streams "tick" every RefreshInterval: the runners and fleet
// pages refresh on it.
func (u *UI) handleTicks(w http.ResponseWriter, r *http.Request) {
	s, ok := startSSE(w)
	if !ok {
		return
	}
	t := time.NewTicker(u.cfg.RefreshInterval)
	defer t.Stop()
	for {
		select {
		case now := <-t.C:
			if s.send("tick", strconv.FormatInt(now.Unix(), 10)) != nil {
				return
			}
		case <-r.Context().Done():
			return
		case <-u.stop:
			return
		}
	}
}
