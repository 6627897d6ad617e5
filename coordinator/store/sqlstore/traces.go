package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"time"

	"github.com/berthci/berth/coordinator/store"
)

// traceMeta reads a job's trace size and CRC; store.ErrNotFound if the job
// does not exist, zeros if it has no trace yet.
func traceMeta(sc Row) (store.TraceInfo, error) {
	var size, crc sql.NullInt64
	var key sql.NullString
	if err := sc.Scan(&size, &crc, &key); err != nil {
		return store.TraceInfo{}, notFound(err)
	}
	return store.TraceInfo{Size: size.Int64, CRC32: uint32(crc.Int64), ArchiveKey: key.String}, nil
}

// AppendTrace appends data at offset, which must be the current size.
// The chunk and the new size and running CRC commit together.
func (s *Store) AppendTrace(ctx context.Context, jobID, offset int64, data []byte) (int64, error) {
	data = append([]byte(nil), data...) // the caller may reuse its buffer once we return
	var size int64
	err := s.writeRow(ctx, func(tx *wtx) error {
		ti, err := traceMeta(tx.queryRow(sqlTraceMeta, jobID))
		if err != nil {
			return err
		}
		size = ti.Size
		if ti.ArchiveKey != "" {
			return store.ErrTraceArchived
		}
		if offset != ti.Size {
			return &store.RangeError{Size: ti.Size}
		}
		if len(data) == 0 {
			return nil
		}
		// The meta row moves first, by compare-and-set on the size it was
		// read with: of two appends at one offset, the second finds the
		// size changed (on engines with concurrent writers, after waiting
		// for the first) and reports the new size.
		newSize := ti.Size + int64(len(data))
		crc := int64(crc32.Update(ti.CRC32, crc32.IEEETable, data))
		n, err := tx.exec(sqlAdvanceTrace, newSize, crc, jobID, ti.Size)
		if err == nil && n == 0 && ti.Size == 0 {
			n, err = tx.exec(sqlStartTrace, jobID, newSize, crc)
		}
		if err != nil {
			return err
		}
		if n == 0 {
			cur, err := traceMeta(tx.queryRow(sqlTraceMeta, jobID))
			if err != nil {
				return err
			}
			size = cur.Size
			if cur.ArchiveKey != "" {
				return store.ErrTraceArchived
			}
			return &store.RangeError{Size: cur.Size}
		}
		if _, err := tx.exec(sqlInsertChunk, jobID, offset, data); err != nil {
			return err
		}
		size = ti.Size + int64(len(data))
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("appending to trace of job %d at %d: %w", jobID, offset, err)
	}
	return size, nil
}

// ResetTrace discards a job's trace.
func (s *Store) ResetTrace(ctx context.Context, jobID int64) error {
	err := s.write(ctx, func(tx *wtx) error {
		ti, err := traceMeta(tx.queryRow(sqlTraceMeta, jobID))
		if err != nil {
			return err
		}
		if ti.ArchiveKey != "" {
			return store.ErrTraceArchived
		}
		// The meta row first, so a concurrent append (which moves it
		// first too) is wholly before or wholly after the reset.
		n, err := tx.exec(sqlDeleteTrace, jobID)
		if err != nil {
			return err
		}
		if n == 0 && ti.Size > 0 {
			if cur, err := traceMeta(tx.queryRow(sqlTraceMeta, jobID)); err != nil {
				return err
			} else if cur.ArchiveKey != "" {
				return store.ErrTraceArchived // archived since it was read
			}
		}
		_, err = tx.exec(sqlDeleteChunks, jobID)
		return err
	})
	if err != nil {
		return fmt.Errorf("resetting trace of job %d: %w", jobID, err)
	}
	return nil
}

// TraceInfo returns the size and CRC-32 of a job's trace.
func (s *Store) TraceInfo(ctx context.Context, jobID int64) (store.TraceInfo, error) {
	ti, err := traceMeta(s.queryRow(ctx, sqlTraceMeta, jobID))
	if err != nil {
		return store.TraceInfo{}, fmt.Errorf("getting trace info of job %d: %w", jobID, err)
	}
	return ti, nil
}

// ReadTrace writes a job's trace from offset on to w. It reads one
// snapshot: a concurrent append or reset is either wholly in or wholly out.
func (s *Store) ReadTrace(ctx context.Context, jobID, offset int64, w io.Writer) (int64, error) {
	n, err := s.readTrace(ctx, jobID, offset, w)
	if err != nil {
		return n, fmt.Errorf("reading trace of job %d from %d: %w", jobID, offset, err)
	}
	return n, nil
}

func (s *Store) readTrace(ctx context.Context, jobID, offset int64, w io.Writer) (int64, error) {
	if w == nil {
		return 0, fmt.Errorf("nil writer: %w", errInvalid)
	}
	var written int64
	err := s.b.Snapshot(ctx, func(tx Tx) error {
		written = 0
		ti, err := traceMeta(tx.QueryRow(sqlTraceMeta, jobID))
		if err != nil {
			return err
		}
		if ti.ArchiveKey != "" {
			return store.ErrTraceArchived
		}
		if offset < 0 || offset > ti.Size {
			return &store.RangeError{Size: ti.Size}
		}
		if offset == ti.Size {
			return nil
		}
		rows, err := tx.Query(sqlReadChunks, jobID, offset)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				pos  int64
				data sql.RawBytes
			)
			if err := rows.Scan(&pos, &data); err != nil {
				return err
			}
			if skip := offset - pos; skip > 0 {
				data = data[min(skip, int64(len(data))):]
			}
			n, err := w.Write(data)
			written += int64(n)
			if err != nil {
				return err
			}
		}
		return rows.Err()
	})
	return written, err
}

// TracesToArchive lists finished jobs whose trace is still in the store.
func (s *Store) TracesToArchive(ctx context.Context, finishedBefore time.Time, limit int) ([]int64, error) {
	lim := int64(limit)
	if lim <= 0 {
		lim = math.MaxInt64
	}
	rows, err := s.query(ctx, sqlTracesToArchive, finishedBefore.UnixMicro(), lim)
	if err != nil {
		return nil, fmt.Errorf("listing traces to archive: %w", err)
	}
	defer rows.Close()
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("listing traces to archive: %w", err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing traces to archive: %w", err)
	}
	return ids, nil
}

// ArchiveTrace marks a trace archived under key and drops its chunks, by
// compare-and-set on the size the archiver copied: an append that commits
// first makes it fail, and one that comes after finds the trace archived.
func (s *Store) ArchiveTrace(ctx context.Context, jobID, size int64, key string) error {
	if key == "" || size <= 0 {
		return fmt.Errorf("archiving trace of job %d: size %d, key %q: %w", jobID, size, key, errInvalid)
	}
	err := s.writeRow(ctx, func(tx *wtx) error {
		n, err := tx.exec(sqlArchiveTrace, key, jobID, size)
		if err != nil {
			return err
		}
		if n == 0 {
			ti, err := traceMeta(tx.queryRow(sqlTraceMeta, jobID))
			switch {
			case err != nil:
				return err
			case ti.ArchiveKey != "":
				return store.ErrTraceArchived
			case ti.Size == 0:
				return store.ErrNotFound
			default:
				return &store.RangeError{Size: ti.Size}
			}
		}
		_, err = tx.exec(sqlDeleteChunks, jobID)
		return err
	})
	if err != nil {
		return fmt.Errorf("archiving trace of job %d: %w", jobID, err)
	}
	return nil
}

// UnarchiveTrace puts an archived trace back as one chunk, by
// compare-and-set on the key, size and CRC, which data must match.
func (s *Store) UnarchiveTrace(ctx context.Context, jobID int64, key string, data []byte) error {
	if key == "" || len(data) == 0 {
		return fmt.Errorf("bringing back trace of job %d: %d bytes, key %q: %w", jobID, len(data), key, errInvalid)
	}
	data = append([]byte(nil), data...)
	crc := int64(crc32.ChecksumIEEE(data))
	err := s.writeRow(ctx, func(tx *wtx) error {
		n, err := tx.exec(sqlUnarchiveTrace, jobID, key, int64(len(data)), crc)
		if err != nil {
			return err
		}
		if n == 0 {
			ti, err := traceMeta(tx.queryRow(sqlTraceMeta, jobID))
			switch {
			case err != nil:
				return err
			case ti.ArchiveKey == key:
				return fmt.Errorf("%d bytes with CRC %08x do not match the archived trace (%d bytes, CRC %08x)", len(data), uint32(crc), ti.Size, ti.CRC32)
			default:
				return store.ErrConflict
			}
		}
		_, err = tx.exec(sqlInsertChunk, jobID, int64(0), data)
		return err
	})
	if err != nil {
		return fmt.Errorf("bringing back trace of job %d: %w", jobID, err)
	}
	return nil
}
