package artifacts

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// S3 stores artifacts as objects of an S3-compatible object store, under
// PREFIX/KEY in one bucket.
//
// Put sends an object of up to one part (8 MiB by default) in a single
// PUT, which S3 makes visible whole; a larger one as a multipart upload,
// which becomes visible only when completed, and which is aborted when the
// body runs past max, the reader fails or the context ends. Memory: one
// part per Put in progress. Open is one GET, read as it streams. Delete asks for the object's
// metadata first, because S3 deletes a missing key without complaint, so a
// Delete racing another Delete of the same key may both succeed.
type S3 struct {
	client   *minio.Client
	cfg      S3Config
	partSize int64
}

// defaultPartSize is the part of a multipart upload, and the largest
// object sent in a single PUT: 8 MiB keeps memory per upload small while
// allowing objects of 78 GiB (10,000 parts); a larger max grows it.
const defaultPartSize = 8 << 20

// maxParts is S3's limit of parts in one upload.
const maxParts = 10000

// OpenS3 returns the Storage of an object store URL (ParseS3URL), with
// credentials from the URL's credentials_file or the AWS_* variables read
// with getenv (os.Getenv). It checks that the bucket exists and the
// credentials may see it, so a wrong endpoint, bucket or key shows at
// start. Errors never hold the secret key.
func OpenS3(ctx context.Context, rawURL string, getenv func(string) string) (*S3, error) {
	cfg, err := ParseS3URL(rawURL)
	if err != nil {
		return nil, err
	}
	return NewS3(ctx, cfg, getenv)
}

// NewS3 is OpenS3 with the URL already parsed.
func NewS3(ctx context.Context, cfg S3Config, getenv func(string) string) (*S3, error) {
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	where := cfg.String()
	cr, err := cfg.credentials(getenv)
	if err != nil {
		return nil, fmt.Errorf("object store %s: %w", where, err)
	}
	opts := &minio.Options{
		Creds:      credentials.NewStaticV4(cr.AccessKey, cr.SecretKey, cr.SessionToken),
		Secure:     !cfg.Insecure,
		Region:     cfg.Region,
		MaxRetries: 3,
	}
	if cfg.PathStyle != nil {
		opts.BucketLookup = minio.BucketLookupDNS
		if *cfg.PathStyle {
			opts.BucketLookup = minio.BucketLookupPath
		}
	}
	client, err := minio.New(cfg.Endpoint, opts)
	if err != nil {
		return nil, fmt.Errorf("object store %s: %w", where, err)
	}
	s := &S3{client: client, cfg: cfg, partSize: defaultPartSize}
	ok, err := client.BucketExists(ctx, cfg.Bucket)
	if err != nil {
		return nil, fmt.Errorf("object store %s: checking the bucket: %w", where, s3Error(err))
	}
	if !ok {
		return nil, fmt.Errorf("object store %s: bucket %q does not exist", where, cfg.Bucket)
	}
	return s, nil
}

// Config is the store's parsed URL.
func (s *S3) Config() S3Config { return s.cfg }

func (s *S3) object(key string) (string, error) {
	if err := CheckKey(key); err != nil {
		return "", err
	}
	if s.cfg.Prefix == "" {
		return key, nil
	}
	return s.cfg.Prefix + "/" + key, nil
}

// Put implements Storage.
func (s *S3) Put(ctx context.Context, key string, r io.Reader, max int64) (int64, error) {
	name, err := s.object(key)
	if err != nil {
		return 0, err
	}
	n, err := s.put(ctx, name, r, max)
	if err != nil {
		return 0, fmt.Errorf("storing artifact %s: %w", key, err)
	}
	return n, nil
}

func (s *S3) put(ctx context.Context, name string, r io.Reader, max int64) (int64, error) {
	partSize := s.partSize
	if max > 0 && (max+maxParts-1)/maxParts > partSize {
		partSize = (max + maxParts - 1) / maxParts
	}
	src := &limitReader{r: ctxReader{ctx, r}, left: max, limited: max > 0}
	var first bytes.Buffer
	n, err := io.CopyN(&first, src, partSize)
	switch {
	case errors.Is(err, io.EOF):
		// The whole body fits in one part: a single PUT.
		_, err := s.client.PutObject(ctx, s.cfg.Bucket, name, bytes.NewReader(first.Bytes()), n,
			minio.PutObjectOptions{ContentType: "application/octet-stream", DisableMultipart: true})
		if err != nil {
			return 0, s3Error(err)
		}
		return n, nil
	case err != nil:
		return 0, err
	}
	return s.putMultipart(ctx, name, src, first.Bytes(), partSize)
}

// putMultipart uploads first and the rest of src in parts of partSize,
// aborting the upload on any failure so that no part is left stored.
func (s *S3) putMultipart(ctx context.Context, name string, src io.Reader, first []byte, partSize int64) (size int64, err error) {
	core := minio.Core{Client: s.client}
	opts := minio.PutObjectOptions{ContentType: "application/octet-stream"}
	id, err := core.NewMultipartUpload(ctx, s.cfg.Bucket, name, opts)
	if err != nil {
		return 0, s3Error(err)
	}
	defer func() {
		if err == nil {
			return
		}
		// The request's context may be over: abort on a context of our
		// own, bounded.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if aerr := core.AbortMultipartUpload(actx, s.cfg.Bucket, name, id); aerr != nil {
			err = fmt.Errorf("%w (aborting the multipart upload failed too, parts stay until the bucket's lifecycle rules remove them: %v)", err, s3Error(aerr))
		}
	}()
	var parts []minio.CompletePart
	upload := func(b []byte) error {
		if len(parts) >= maxParts {
			return fmt.Errorf("more than %d parts of %d bytes", maxParts, partSize)
		}
		p, err := core.PutObjectPart(ctx, s.cfg.Bucket, name, id, len(parts)+1, bytes.NewReader(b), int64(len(b)), minio.PutObjectPartOptions{})
		if err != nil {
			return s3Error(err)
		}
		parts = append(parts, minio.CompletePart{PartNumber: p.PartNumber, ETag: p.ETag})
		size += int64(len(b))
		return nil
	}
	if err := upload(first); err != nil {
		return 0, err
	}
	buf := make([]byte, partSize)
	for {
		n, rerr := io.ReadFull(src, buf)
		if n > 0 {
			if err := upload(buf[:n]); err != nil {
				return 0, err
			}
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			return 0, rerr
		}
	}
	if _, err := core.CompleteMultipartUpload(ctx, s.cfg.Bucket, name, id, parts, opts); err != nil {
		return 0, s3Error(err)
	}
	return size, nil
}

// Open implements Storage.
func (s *S3) Open(ctx context.Context, key string) (io.ReadCloser, int64, error) {
	name, err := s.object(key)
	if err != nil {
		return nil, 0, err
	}
	// One GET: its headers give the size, its body is the object as
	// it was when the request was answered.
	body, info, _, err := minio.Core{Client: s.client}.GetObject(ctx, s.cfg.Bucket, name, minio.GetObjectOptions{})
	if err != nil {
		return nil, 0, fmt.Errorf("opening artifact %s: %w", key, s3Error(err))
	}
	return body, info.Size, nil
}

// Delete implements Storage.
func (s *S3) Delete(ctx context.Context, key string) error {
	name, err := s.object(key)
	if err != nil {
		return err
	}
	if _, err := s.client.StatObject(ctx, s.cfg.Bucket, name, minio.StatObjectOptions{}); err != nil {
		return fmt.Errorf("deleting artifact %s: %w", key, s3Error(err))
	}
	if err := s.client.RemoveObject(ctx, s.cfg.Bucket, name, minio.RemoveObjectOptions{}); err != nil {
		return fmt.Errorf("deleting artifact %s: %w", key, s3Error(err))
	}
	return nil
}

// s3Error classifies an error of the S3 client: a missing key is
// ErrNotFound; other answers of the server keep its code and message.
func s3Error(err error) error {
	var resp minio.ErrorResponse
	if !errors.As(err, &resp) {
		return err
	}
	switch {
	case resp.Code == "NoSuchKey" || (resp.StatusCode == http.StatusNotFound && resp.Code != "NoSuchBucket"):
		return fmt.Errorf("%w (%s)", ErrNotFound, resp.Code)
	case resp.Code != "":
		return fmt.Errorf("%s: %s (HTTP %d)", resp.Code, resp.Message, resp.StatusCode)
	}
	return err
}

// limitReader fails with ErrTooLarge once more than left bytes would be
// read (when limited); exactly left bytes followed by EOF is fine.
type limitReader struct {
	r       io.Reader
	left    int64
	limited bool
}

func (l *limitReader) Read(p []byte) (int, error) {
	if !l.limited {
		return l.r.Read(p)
	}
	if l.left <= 0 {
		var probe [1]byte
		n, err := l.r.Read(probe[:])
		if n > 0 {
			return 0, ErrTooLarge
		}
		return 0, err
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.r.Read(p)
	l.left -= int64(n)
	return n, err
}
