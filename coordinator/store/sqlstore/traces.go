package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"hash/crc32"
	"io"

	"github.com/berthci/berth/coordinator/store"
)

// traceMeta reads a job's trace size and CRC; store.ErrNotFound if the job
// does not exist, zeros if it has no trace yet.
func traceMeta(sc Row) (store.TraceInfo, error) {
	var size, crc sql.NullInt64
	if err := sc.Scan(&size, &crc); err != nil {
		return store.TraceInfo{}, notFound(err)
	}
	return store.TraceInfo{Size: size.Int64, CRC32: uint32(crc.Int64)}, nil
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
		if _, err := traceMeta(tx.queryRow(sqlTraceMeta, jobID)); err != nil {
			return err
		}
		// The meta row first, so a concurrent append (which moves it
		// first too) is wholly before or wholly after the reset.
		if _, err := tx.exec(sqlDeleteTrace, jobID); err != nil {
			return err
		}
		_, err := tx.exec(sqlDeleteChunks, jobID)
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
