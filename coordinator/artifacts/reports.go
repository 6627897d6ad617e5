package artifacts

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
)

// ReportFiles splits a stored report (artifacts:reports) of a format into
// its files: gzip as the runner uploads a report, one gzip member per
// file, or raw, one file. Their decompressed bytes together may not pass
// max (a small gzip can hold gigabytes). GitLab reads reports the same
// way (its GzipStream adapter).
func ReportFiles(data []byte, format string, max int) ([][]byte, error) {
	switch format {
	case "raw":
		if len(data) > max {
			return nil, fmt.Errorf("larger than %d bytes", max)
		}
		return [][]byte{data}, nil
	case "gzip":
	default:
		return nil, fmt.Errorf("artifact_format must be gzip or raw, not %q", format)
	}
	// As documented for gzip.Reader.Multistream: a bytes.Reader is a
	// ByteReader, so each Reset starts exactly at the next member.
	br := bytes.NewReader(data)
	zr, err := gzip.NewReader(br)
	if err != nil {
		return nil, fmt.Errorf("not a gzip file: %v", err)
	}
	var files [][]byte
	total := 0
	for {
		zr.Multistream(false)
		b, err := io.ReadAll(io.LimitReader(zr, int64(max-total+1)))
		if err != nil {
			return nil, fmt.Errorf("reading gzip: %v", err)
		}
		if total += len(b); total > max {
			return nil, fmt.Errorf("larger than %d bytes decompressed", max)
		}
		files = append(files, b)
		if err := zr.Reset(br); err == io.EOF {
			return files, nil
		} else if err != nil {
			return nil, fmt.Errorf("reading gzip: %v", err)
		}
	}
}
