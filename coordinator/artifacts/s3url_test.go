package artifacts

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseS3URL(t *testing.T) {
	yes, no := true, false
	for _, tc := range []struct {
		url  string
		want S3Config
		err  string
	}{
		{url: "s3://bucket", want: S3Config{Bucket: "bucket", Endpoint: DefaultS3Endpoint}},
		{url: "s3://my-bucket/a/b/?endpoint=127.0.0.1:9000&region=us-east-1&insecure=true&path_style=true",
			want: S3Config{Bucket: "my-bucket", Prefix: "a/b", Endpoint: "127.0.0.1:9000", Region: "us-east-1", Insecure: true, PathStyle: &yes}},
		{url: "s3://b.example/p?endpoint=s3.eu-west-1.amazonaws.com&path_style=false&credentials_file=/etc/berth/s3&profile=ci",
			want: S3Config{Bucket: "b.example", Prefix: "p", Endpoint: "s3.eu-west-1.amazonaws.com", PathStyle: &no, CredentialsFile: "/etc/berth/s3", Profile: "ci"}},
		{url: "s3://bkt?endpoint=[::1]:9000", want: S3Config{Bucket: "bkt", Endpoint: "[::1]:9000"}},
		{url: "", err: "empty"},
		{url: "https://bucket/x", err: `scheme must be s3`},
		{url: "s3:bucket", err: "two slashes"},
		{url: "s3:///prefix", err: "no bucket"},
		{url: "s3://AKIA:hunter2@bucket", err: "credentials in the URL are refused"},
		{url: "s3://Bad_Bucket", err: `bucket "Bad_Bucket"`},
		{url: "s3://bucket/a//b", err: `prefix "a//b"`},
		{url: "s3://bucket/a/../b", err: `prefix "a/../b"`},
		{url: "s3://bucket?endpoint=http://host:9000", err: "without a scheme"},
		{url: "s3://bucket?endpoint=host:99999", err: `port "99999"`},
		{url: "s3://bucket?endpoint=", err: `endpoint "": empty`},
		{url: "s3://bucket?insecure=yes", err: `insecure: want true or false, not "yes"`},
		{url: "s3://bucket?path_style=maybe", err: `path_style: want true or false`},
		{url: "s3://bucket?region=", err: `region ""`},
		{url: "s3://bucket?region=a&region=b", err: `"region" given 2 times`},
		{url: "s3://bucket?secret=x", err: `unknown query parameter "secret"`},
		{url: "s3://bucket?profile=ci", err: "profile needs credentials_file"},
		{url: "s3://bucket#frag", err: "fragment"},
		{url: "s3://bucket?%zz", err: "query"},
	} {
		got, err := ParseS3URL(tc.url)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseS3URL(%q) = %v, want error containing %q", tc.url, err, tc.err)
			}
			if err != nil && strings.Contains(err.Error(), "hunter2") {
				t.Errorf("ParseS3URL(%q): the error repeats the secret: %v", tc.url, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseS3URL(%q): %v", tc.url, err)
			continue
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseS3URL(%q) = %+v, want %+v", tc.url, got, tc.want)
		}
		again, err := ParseS3URL(got.String())
		if err != nil || !reflect.DeepEqual(again, got) {
			t.Errorf("String() %q does not parse back: %+v, %v", got.String(), again, err)
		}
	}
}

func TestS3Credentials(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	cr, err := S3Config{}.credentials(env(map[string]string{"AWS_ACCESS_KEY_ID": "AK", "AWS_SECRET_ACCESS_KEY": "SK", "AWS_SESSION_TOKEN": "ST"}))
	if err != nil || cr != (s3Credentials{"AK", "SK", "ST"}) {
		t.Errorf("from the environment: %+v, %v", cr, err)
	}
	for _, m := range []map[string]string{{}, {"AWS_ACCESS_KEY_ID": "AK"}, {"AWS_SECRET_ACCESS_KEY": "s3cr3t"}} {
		if _, err := (S3Config{}).credentials(env(m)); err == nil || strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("credentials from %v: %v, want an error without the secret", m, err)
		}
	}
}

func TestParseCredentialsFile(t *testing.T) {
	const file = `# comment
[default]
aws_access_key_id = AKDEFAULT
aws_secret_access_key = skdefault

[profile ci]
; another comment
aws_access_key_id=AKCI
aws_secret_access_key=skci=with=equals
aws_session_token = tok
region = eu-west-1
`
	for _, tc := range []struct {
		data, profile string
		want          s3Credentials
		err           string
	}{
		{data: file, profile: "default", want: s3Credentials{"AKDEFAULT", "skdefault", ""}},
		{data: file, profile: "ci", want: s3Credentials{"AKCI", "skci=with=equals", "tok"}},
		{data: file, profile: "missing", err: "no [missing] profile"},
		{data: "[default]\naws_access_key_id = AK\n", profile: "default", err: "needs aws_access_key_id and aws_secret_access_key"},
		{data: "[default]\naws_secret_access_key sup3rsecret\n", profile: "default", err: "line 2: want key = value"},
		{data: "[default\n", profile: "default", err: "line 1"},
	} {
		got, err := parseCredentialsFile([]byte(tc.data), tc.profile)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("profile %s: %v, want error containing %q", tc.profile, err, tc.err)
			}
			if err != nil && strings.Contains(err.Error(), "sup3rsecret") {
				t.Errorf("the error repeats the file's text: %v", err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("profile %s: %+v, %v; want %+v", tc.profile, got, err, tc.want)
		}
	}
}

// FuzzParseS3URL: the parser of --object-store never panics, never
// repeats a URL's password in its errors, and what it accepts prints as a
// URL that parses to the same thing.
func FuzzParseS3URL(f *testing.F) {
	for _, s := range []string{
		"s3://bucket", "s3://b/p/q?endpoint=127.0.0.1:9000&region=us-east-1&insecure=true",
		"s3://b?path_style=false&credentials_file=/x&profile=p", "s3://u:pw@b", "s3:b", "s3://b/../x", "s3://b?endpoint=[::1]:1",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		c, err := ParseS3URL(raw)
		if err != nil {
			if i := strings.Index(raw, "://"); i >= 0 {
				if at := strings.LastIndex(raw, "@"); at > i {
					userinfo := raw[i+3 : at]
					if _, pw, ok := strings.Cut(userinfo, ":"); ok && len(pw) >= 4 && strings.Contains(err.Error(), pw) {
						t.Fatalf("error repeats the password %q: %v", pw, err)
					}
				}
			}
			return
		}
		again, err := ParseS3URL(c.String())
		if err != nil || !reflect.DeepEqual(again, c) {
			t.Fatalf("%q parsed to %+v, printed as %q, parsed again to %+v, %v", raw, c, c.String(), again, err)
		}
	})
}
