// Package joblog keeps the jobs' logs (GitLab's traces). A job's log
// grows in the store while the job runs (appends are small, ordered and
// checked by offset, which is what a database does well); once the job has
// been finished for a while, the cluster's leader copies the log to the
// artifact storage (a directory, or the S3 bucket replicas share) and the
// store keeps only its size, CRC and key. Readers find it wherever it is.
// A line the coordinator adds to an archived log later (a bridge following
// its downstream pipeline again, a release) brings the log back into the
// store first; it is archived again on a later round.
package joblog

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"time"

	"github.com/berthci/berth/coordinator/artifacts"
	"github.com/berthci/berth/coordinator/store"
	"github.com/prometheus/client_golang/prometheus"
)

// Logs reads and writes the jobs' logs. It is safe for concurrent use;
// every change is a conditional write on the store, so several replicas
// may share one store and one artifact storage.
type Logs struct {
	store     store.Store
	artifacts artifacts.Storage
	log       *slog.Logger
	// archiveAfter: how long after a job finished its log is archived
	// (negative: never).
	archiveAfter time.Duration
	archived     prometheus.Counter
}

// Options are what Logs works with.
type Options struct {
	Store     store.Store
	Artifacts artifacts.Storage
	Logger    *slog.Logger // nil: discard
	// ArchiveAfter is how long after a job finished Archive moves its log
	// to the artifact storage (negative: never).
	ArchiveAfter time.Duration
	// Registerer receives the archived logs counter (nil: none).
	Registerer prometheus.Registerer
}

// New returns the logs kept in opts.Store and opts.Artifacts.
func New(opts Options) *Logs {
	l := &Logs{store: opts.Store, artifacts: opts.Artifacts, log: opts.Logger, archiveAfter: opts.ArchiveAfter,
		archived: prometheus.NewCounter(prometheus.CounterOpts{Name: "berth_coordinator_traces_archived_total",
			Help: "Logs of finished jobs moved from the store to the artifact storage."})}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	if opts.Registerer != nil {
		// A second coordinator on the same registry (tests, restarts in
		// process) keeps the first one's collector.
		_ = opts.Registerer.Register(l.archived)
	}
	return l
}

// archiveBatch bounds the traces archived in one reaper round.
const archiveBatch = 200

// traceKey is where a job's trace is archived: the size in the name makes
// a log archived again after growing a new object, so the old one can be
// deleted without racing a reader of the new one.
func traceKey(jobID, size int64) string {
	return fmt.Sprintf("%d/trace.%d.log", jobID, size)
}

// Archive archives the logs of jobs finished before now minus
// ArchiveAfter, a batch at a time: the cluster's leader calls it on every
// round of its reaper.
func (l *Logs) Archive(ctx context.Context, now time.Time) error {
	if l.archiveAfter < 0 {
		return nil
	}
	ids, err := l.store.TracesToArchive(ctx, now.Add(-l.archiveAfter), archiveBatch)
	if err != nil {
		return err
	}
	var errs []error
	for _, id := range ids {
		if err := l.archiveTrace(ctx, id); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// archiveTrace copies one job's log to the artifact storage and then
// drops it from the store, by compare-and-set on the size it copied.
func (l *Logs) archiveTrace(ctx context.Context, jobID int64) error {
	ti, err := l.store.TraceInfo(ctx, jobID)
	if err != nil || ti.ArchiveKey != "" || ti.Size == 0 {
		return err
	}
	key := traceKey(jobID, ti.Size)
	pr, pw := io.Pipe()
	go func() {
		_, err := l.store.ReadTrace(ctx, jobID, 0, pw)
		pw.CloseWithError(err)
	}()
	crc := crc32.NewIEEE()
	n, err := l.artifacts.Put(ctx, key, io.TeeReader(io.LimitReader(pr, ti.Size), crc), 0)
	pr.Close()
	if err != nil {
		return fmt.Errorf("archiving trace of job %d: %w", jobID, err)
	}
	if n != ti.Size || crc.Sum32() != ti.CRC32 {
		// The log changed between its meta and its bytes: next round.
		l.deleteTraceObject(ctx, jobID, key)
		return nil
	}
	err = l.store.ArchiveTrace(ctx, jobID, ti.Size, key)
	var rerr *store.RangeError
	switch {
	case err == nil:
		l.archived.Inc()
		l.log.Debug("job log archived", "job_id", jobID, "key", key, "size", ti.Size)
		return nil
	case errors.As(err, &rerr):
		// A line came in after the copy: archived again next round.
		l.deleteTraceObject(ctx, jobID, key)
		return nil
	case errors.Is(err, store.ErrTraceArchived):
		// Another replica (a leader that just lost the lead) archived it;
		// the object is theirs if they chose the same key.
		if now, err := l.store.TraceInfo(ctx, jobID); err == nil && now.ArchiveKey != key {
			l.deleteTraceObject(ctx, jobID, key)
		}
		return nil
	default:
		l.deleteTraceObject(ctx, jobID, key)
		return err
	}
}

// DeleteArchive deletes a job's archived log object, if it has one: for
// a job about to be deleted, whose records go with it.
func (l *Logs) DeleteArchive(ctx context.Context, jobID int64) error {
	ti, err := l.store.TraceInfo(ctx, jobID)
	if err != nil || ti.ArchiveKey == "" {
		return err
	}
	if err := l.artifacts.Delete(ctx, ti.ArchiveKey); err != nil && !errors.Is(err, artifacts.ErrNotFound) {
		return fmt.Errorf("deleting the archived log of job %d: %w", jobID, err)
	}
	return nil
}

func (l *Logs) deleteTraceObject(ctx context.Context, jobID int64, key string) {
	if err := l.artifacts.Delete(ctx, key); err != nil && !errors.Is(err, artifacts.ErrNotFound) {
		l.log.Warn("deleting an archived job log", "job_id", jobID, "key", key, "err", err)
	}
}

// Read writes a job's log from offset on to w, from the store or
// from its archive. Like store.ReadTrace it answers *store.RangeError for
// an offset past the end.
func (l *Logs) Read(ctx context.Context, jobID, offset int64, w io.Writer) (int64, error) {
	for tries := 0; ; tries++ {
		n, err := l.store.ReadTrace(ctx, jobID, offset, w)
		if !errors.Is(err, store.ErrTraceArchived) {
			return n, err
		}
		ti, err := l.store.TraceInfo(ctx, jobID)
		if err != nil {
			return 0, err
		}
		if ti.ArchiveKey == "" {
			continue // brought back since: read it from the store
		}
		n, err = l.readArchivedTrace(ctx, ti, offset, w)
		if errors.Is(err, artifacts.ErrNotFound) && tries < 3 {
			continue // brought back and its object deleted since
		}
		return n, err
	}
}

func (l *Logs) readArchivedTrace(ctx context.Context, ti store.TraceInfo, offset int64, w io.Writer) (int64, error) {
	if offset < 0 || offset > ti.Size {
		return 0, &store.RangeError{Size: ti.Size}
	}
	rc, size, err := l.artifacts.Open(ctx, ti.ArchiveKey)
	if err != nil {
		return 0, err
	}
	defer rc.Close()
	if size != ti.Size {
		return 0, fmt.Errorf("archived log %s is %d bytes, the store says %d", ti.ArchiveKey, size, ti.Size)
	}
	if sk, ok := rc.(io.Seeker); ok {
		if _, err := sk.Seek(offset, io.SeekStart); err != nil {
			return 0, err
		}
	} else if _, err := io.CopyN(io.Discard, rc, offset); err != nil {
		return 0, err
	}
	return io.Copy(w, rc)
}

// Append appends data to a job's log at offset (store.AppendTrace),
// bringing an archived log back into the store first.
func (l *Logs) Append(ctx context.Context, jobID, offset int64, data []byte) (int64, error) {
	for tries := 0; ; tries++ {
		size, err := l.store.AppendTrace(ctx, jobID, offset, data)
		if !errors.Is(err, store.ErrTraceArchived) || tries == 3 {
			return size, err
		}
		if err := l.unarchiveTrace(ctx, jobID); err != nil {
			return 0, err
		}
	}
}

// Reset is store.ResetTrace for a log that may be archived.
func (l *Logs) Reset(ctx context.Context, jobID int64) error {
	err := l.store.ResetTrace(ctx, jobID)
	if errors.Is(err, store.ErrTraceArchived) {
		if err := l.unarchiveTrace(ctx, jobID); err != nil {
			return err
		}
		err = l.store.ResetTrace(ctx, jobID)
	}
	return err
}

// unarchiveTrace brings an archived log back into the store and deletes
// its object.
func (l *Logs) unarchiveTrace(ctx context.Context, jobID int64) error {
	ti, err := l.store.TraceInfo(ctx, jobID)
	if err != nil || ti.ArchiveKey == "" {
		return err
	}
	var buf bytes.Buffer
	if _, err := l.readArchivedTrace(ctx, ti, 0, &buf); err != nil {
		return fmt.Errorf("reading the archived log of job %d: %w", jobID, err)
	}
	err = l.store.UnarchiveTrace(ctx, jobID, ti.ArchiveKey, buf.Bytes())
	if errors.Is(err, store.ErrConflict) {
		return nil // another writer brought it back
	}
	if err != nil {
		return err
	}
	l.deleteTraceObject(ctx, jobID, ti.ArchiveKey)
	return nil
}

// AddLine adds a line of the coordinator's own (a bridge's messages, a
// release) to the end of a job's log.
func (l *Logs) AddLine(ctx context.Context, jobID int64, text string) {
	var err error
	for range 5 {
		var ti store.TraceInfo
		if ti, err = l.store.TraceInfo(ctx, jobID); err != nil {
			break
		}
		if _, err = l.Append(ctx, jobID, ti.Size, []byte(text)); !errors.As(err, new(*store.RangeError)) {
			break
		}
	}
	if err != nil {
		l.log.Warn("adding to a job's log", "job_id", jobID, "err", err)
	}
}
