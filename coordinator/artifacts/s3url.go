package artifacts

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path"
	"strconv"
	"strings"

	"github.com/minio/minio-go/v7/pkg/s3utils"
)

// S3Config is an object store URL, parsed:
//
//	s3://BUCKET[/PREFIX][?endpoint=HOST[:PORT]&region=REGION&insecure=true
//	                     &path_style=true|false&credentials_file=PATH&profile=NAME]
//
// Credentials are never part of the URL (a URL with user information is
// refused): they come from credentials_file (the AWS shared credentials
// format) or, without it, from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY
// and AWS_SESSION_TOKEN.
type S3Config struct {
	// Bucket is the bucket's name; it must exist.
	Bucket string
	// Prefix is prepended to every key ("" or a clean path without
	// leading or trailing slash): PREFIX/KEY.
	Prefix string
	// Endpoint is host[:port] of the S3 API (default s3.amazonaws.com).
	Endpoint string
	// Region is the bucket's region ("": asked of the server once).
	Region string
	// Insecure talks plain HTTP instead of HTTPS.
	Insecure bool
	// PathStyle is true for http://host/bucket/key requests, false for
	// http://bucket.host/key; nil chooses by endpoint, as the AWS SDKs do.
	PathStyle *bool
	// CredentialsFile is an AWS shared credentials file; Profile its
	// section (default: $AWS_PROFILE, else "default").
	CredentialsFile string
	Profile         string
}

// DefaultS3Endpoint is the endpoint of a URL without endpoint=.
const DefaultS3Endpoint = "s3.amazonaws.com"

// String is the URL again (it holds no secret).
func (c S3Config) String() string {
	u := url.URL{Scheme: "s3", Host: c.Bucket}
	if c.Prefix != "" {
		u.Path = "/" + c.Prefix
	}
	q := url.Values{}
	if c.Endpoint != "" && c.Endpoint != DefaultS3Endpoint {
		q.Set("endpoint", c.Endpoint)
	}
	if c.Region != "" {
		q.Set("region", c.Region)
	}
	if c.Insecure {
		q.Set("insecure", "true")
	}
	if c.PathStyle != nil {
		q.Set("path_style", strconv.FormatBool(*c.PathStyle))
	}
	if c.CredentialsFile != "" {
		q.Set("credentials_file", c.CredentialsFile)
	}
	if c.Profile != "" {
		q.Set("profile", c.Profile)
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// ParseS3URL parses an object store URL (see S3Config). Its errors name
// the part that is wrong and never repeat user information.
func ParseS3URL(raw string) (S3Config, error) {
	bad := func(format string, args ...any) (S3Config, error) {
		return S3Config{}, fmt.Errorf("object store URL: "+format, args...)
	}
	if strings.TrimSpace(raw) == "" {
		return bad("empty")
	}
	u, err := url.Parse(raw)
	if err != nil {
		// url's errors quote the whole URL.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return bad("not a URL: %v", err)
	}
	if u.User != nil {
		return bad("credentials in the URL are refused (they would show in process lists and logs): use AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or credentials_file=")
	}
	if u.Scheme != "s3" {
		return bad("scheme must be s3 (s3://BUCKET/PREFIX?endpoint=HOST:PORT), not %q", u.Scheme)
	}
	if u.Opaque != "" {
		return bad("want s3://BUCKET/PREFIX, with two slashes")
	}
	if u.Fragment != "" || strings.HasSuffix(raw, "#") {
		return bad("a fragment (#…) has no meaning here")
	}
	c := S3Config{Bucket: u.Host, Endpoint: DefaultS3Endpoint}
	if c.Bucket == "" {
		return bad("no bucket: want s3://BUCKET/PREFIX")
	}
	if err := s3utils.CheckValidBucketNameStrict(c.Bucket); err != nil {
		return bad("bucket %q: %v", c.Bucket, err)
	}
	if p := strings.TrimSuffix(strings.TrimPrefix(u.Path, "/"), "/"); p != "" {
		if path.Clean("/"+p) != "/"+p || strings.Contains(p, "\\") {
			return bad("prefix %q: want a clean path (no empty, . or .. parts)", p)
		}
		c.Prefix = p
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return bad("query: %v", err)
	}
	for key, vals := range q {
		if len(vals) != 1 {
			return bad("query parameter %q given %d times", key, len(vals))
		}
		v := vals[0]
		switch key {
		case "endpoint":
			if strings.Contains(v, "://") {
				return bad("endpoint %q: want HOST[:PORT] without a scheme (insecure=true for plain HTTP)", v)
			}
			if err := checkHostPort(v); err != nil {
				return bad("endpoint %q: %v", v, err)
			}
			c.Endpoint = v
		case "region":
			if v == "" || strings.ContainsAny(v, " /\t\n") {
				return bad("region %q: want a region name such as us-east-1", v)
			}
			c.Region = v
		case "insecure", "path_style":
			b, err := strconv.ParseBool(v)
			if err != nil {
				return bad("%s: want true or false, not %q", key, v)
			}
			if key == "insecure" {
				c.Insecure = b
			} else {
				c.PathStyle = &b
			}
		case "credentials_file":
			if v == "" {
				return bad("credentials_file is empty")
			}
			c.CredentialsFile = v
		case "profile":
			if v == "" || strings.ContainsAny(v, "[]\n") {
				return bad("profile %q: want a section name of the credentials file", v)
			}
			c.Profile = v
		default:
			return bad("unknown query parameter %q (known: endpoint, region, insecure, path_style, credentials_file, profile)", key)
		}
	}
	if c.Profile != "" && c.CredentialsFile == "" {
		return bad("profile needs credentials_file")
	}
	return c, nil
}

func checkHostPort(v string) error {
	if v == "" {
		return errors.New("empty")
	}
	host := v
	if h, port, err := net.SplitHostPort(v); err == nil {
		n, perr := strconv.Atoi(port)
		if perr != nil || n <= 0 || n > 65535 {
			return fmt.Errorf("port %q: want 1-65535", port)
		}
		host = h
	} else if strings.Count(v, ":") == 1 {
		return err
	}
	if host == "" || strings.ContainsAny(host, "/?#@ \t\n") {
		return errors.New("want HOST[:PORT]")
	}
	return nil
}

// s3Credentials are an access key pair and an optional session token.
type s3Credentials struct {
	AccessKey, SecretKey, SessionToken string
}

// credentials finds c's credentials: its credentials file, else the AWS_*
// environment variables (read with getenv). Errors name where the
// credentials were looked for, never their values.
func (c S3Config) credentials(getenv func(string) string) (s3Credentials, error) {
	if c.CredentialsFile != "" {
		profile := c.Profile
		if profile == "" {
			profile = getenv("AWS_PROFILE")
		}
		if profile == "" {
			profile = "default"
		}
		data, err := os.ReadFile(c.CredentialsFile)
		if err != nil {
			return s3Credentials{}, fmt.Errorf("reading credentials: %w", err)
		}
		cr, err := parseCredentialsFile(data, profile)
		if err != nil {
			return s3Credentials{}, fmt.Errorf("credentials file %s: %w", c.CredentialsFile, err)
		}
		return cr, nil
	}
	cr := s3Credentials{AccessKey: getenv("AWS_ACCESS_KEY_ID"), SecretKey: getenv("AWS_SECRET_ACCESS_KEY"), SessionToken: getenv("AWS_SESSION_TOKEN")}
	switch {
	case cr.AccessKey == "" && cr.SecretKey == "":
		return s3Credentials{}, errors.New("no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or credentials_file= in the URL")
	case cr.AccessKey == "":
		return s3Credentials{}, errors.New("AWS_SECRET_ACCESS_KEY is set but AWS_ACCESS_KEY_ID is not")
	case cr.SecretKey == "":
		return s3Credentials{}, errors.New("AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not")
	}
	return cr, nil
}

// parseCredentialsFile reads profile from an AWS shared credentials file:
//
//	[default]
//	aws_access_key_id = AKIA…
//	aws_secret_access_key = …
//	aws_session_token = …   (optional)
//
// Other keys and sections are ignored; "#" and ";" start comments. Errors
// give line numbers, never a line's text (it may hold a secret).
func parseCredentialsFile(data []byte, profile string) (s3Credentials, error) {
	var cr s3Credentials
	section, found := "", false
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		if line[0] == '[' {
			if !strings.HasSuffix(line, "]") {
				return s3Credentials{}, fmt.Errorf("line %d: a section header without its closing ]", n)
			}
			section = strings.TrimSpace(line[1 : len(line)-1])
			// ~/.aws/config spells profiles "[profile NAME]".
			section = strings.TrimSpace(strings.TrimPrefix(section, "profile "))
			if section == profile {
				found = true
			}
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return s3Credentials{}, fmt.Errorf("line %d: want key = value", n)
		}
		if section != profile {
			continue
		}
		v = strings.TrimSpace(v)
		switch strings.ToLower(strings.TrimSpace(k)) {
		case "aws_access_key_id":
			cr.AccessKey = v
		case "aws_secret_access_key":
			cr.SecretKey = v
		case "aws_session_token":
			cr.SessionToken = v
		}
	}
	if err := sc.Err(); err != nil {
		return s3Credentials{}, err
	}
	switch {
	case !found:
		return s3Credentials{}, fmt.Errorf("no [%s] profile", profile)
	case cr.AccessKey == "" || cr.SecretKey == "":
		return s3Credentials{}, fmt.Errorf("profile [%s] needs aws_access_key_id and aws_secret_access_key", profile)
	}
	return cr, nil
}
