package ci

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"testing"
	"testing/fstest"
)

func sha1Hex(s string) string {
	sum := sha1.Sum([]byte(s))
	return hex.EncodeToString(sum[:])
}

func TestCacheKeyDigest(t *testing.T) {
	eq(t, "none", CacheKeyDigest(nil), "")
	eq(t, "empty ids", CacheKeyDigest([]string{"", ""}), "")
	// Sorted, distinct, joined by "-", as GitLab's digest_from_hashes.
	eq(t, "two", CacheKeyDigest([]string{"bbb", "aaa", "bbb", ""}), sha1Hex("aaa-bbb"))
	// The blob id of "hello\n", from git hash-object.
	eq(t, "blob id", GitBlobID([]byte("hello\n")), "ce013625030ba8dba906f756967f9e9ca394464a")
}

func TestExpandCacheKeyFiles(t *testing.T) {
	fsys := fstest.MapFS{
		"package.json":             {Data: []byte("{}")},
		"web/package.json":         {Data: []byte("{}")},
		"web/app/package.json":     {Data: []byte("{}")},
		"yarn.lock":                {Data: []byte("x")},
		"sub/yarn.lock":            {Data: []byte("x")},
		".git/package.json":        {Data: []byte("git's own")},
		"web/.git/x/package.json":  {Data: []byte("a nested repository's")},
		"a+b(c).lock":              {Data: []byte("regexp characters")},
		"dir.lock/inside":          {Data: []byte("a directory that matches")},
		"web/app/package.json.bak": {Data: []byte("no")},
	}
	for _, tt := range []struct {
		entries []string
		want    []string
	}{
		// "**/" needs a directory: the root's package.json is not matched,
		// as GitLab's regexp ^.*?/package\.json$ does not match it.
		{[]string{"**/package.json"}, []string{"web/app/package.json", "web/package.json"}},
		{[]string{"*.lock"}, []string{"a+b(c).lock", "yarn.lock"}},
		{[]string{"**.lock"}, []string{"a+b(c).lock", "sub/yarn.lock", "yarn.lock"}},
		{[]string{"web/*/package.json"}, []string{"web/app/package.json"}},
		// Without "*", as written, existing or not; a leading "/" dropped.
		{[]string{"/yarn.lock", "yarn.lock", "missing"}, []string{"missing", "yarn.lock"}},
		{[]string{"a+b(c).lock"}, []string{"a+b(c).lock"}},
		{[]string{"*.none"}, nil},
	} {
		got, err := ExpandCacheKeyFiles(fsys, tt.entries)
		if err != nil {
			t.Fatal(err)
		}
		eq(t, "expand "+tt.entries[0], got, tt.want)
	}
}

type blobFS struct {
	fstest.MapFS
	ids map[string]string
}

func (b blobFS) BlobID(name string) (string, bool) { id, ok := b.ids[name]; return id, ok }

func TestFilesCacheKey(t *testing.T) {
	fsys := fstest.MapFS{
		"Gemfile.lock":     {Data: []byte("hello\n")},
		"web/package.json": {Data: []byte("hello\n")},
		"api/package.json": {Data: []byte("{}\n")},
		"dir/f":            {Data: []byte("x")},
	}
	hello := "ce013625030ba8dba906f756967f9e9ca394464a"
	braces := GitBlobID([]byte("{}\n"))
	for _, tt := range []struct {
		entries []string
		want    string
	}{
		{[]string{"Gemfile.lock"}, sha1Hex(hello)},
		// Two files of the same content count once (distinct ids).
		{[]string{"Gemfile.lock", "web/package.json"}, sha1Hex(hello)},
		{[]string{"**/package.json"}, CacheKeyDigest([]string{hello, braces})},
		// Missing files and directories add nothing; none at all is "".
		{[]string{"Gemfile.lock", "missing"}, sha1Hex(hello)},
		{[]string{"missing", "dir"}, ""},
		{[]string{"a/../Gemfile.lock"}, ""},
	} {
		got, err := FilesCacheKey(fsys, tt.entries)
		if err != nil {
			t.Fatal(err)
		}
		eq(t, "key of "+tt.entries[0], got, tt.want)
	}
	// A tree that knows its blob ids is asked, not read.
	known := blobFS{MapFS: fstest.MapFS{"Gemfile.lock": {Data: []byte("not read")}}, ids: map[string]string{"Gemfile.lock": "1234"}}
	got, err := FilesCacheKey(known, []string{"Gemfile.lock", "missing"})
	if err != nil {
		t.Fatal(err)
	}
	eq(t, "key from known ids", got, sha1Hex("1234"))
}

func TestCommitsCacheKey(t *testing.T) {
	fsys := fstest.MapFS{"a/package.json": {}, "b/package.json": {}, "yarn.lock": {}}
	last := map[string]string{"a/package.json": "c1", "b/package.json": "c2", "yarn.lock": "c1"}
	var asked []string
	get := func(_ context.Context, p string) (string, error) {
		asked = append(asked, p)
		return last[p], nil
	}
	got, err := CommitsCacheKey(context.Background(), fsys, []string{"**/package.json", "yarn.lock", "gone.lock"}, get)
	if err != nil {
		t.Fatal(err)
	}
	eq(t, "key", got, sha1Hex("c1-c2"))
	eq(t, "asked", asked, []string{"a/package.json", "b/package.json", "gone.lock", "yarn.lock"})
	got, _ = CommitsCacheKey(context.Background(), fsys, []string{"gone.lock"}, get)
	eq(t, "no commits", got, "")

	boom := errors.New("git failed")
	if _, err := CommitsCacheKey(context.Background(), fsys, []string{"yarn.lock"}, func(context.Context, string) (string, error) { return "", boom }); !errors.Is(err, boom) {
		t.Errorf("error %v, want the lookup's", err)
	}
}

func TestFSCacheKey(t *testing.T) {
	fsys := fstest.MapFS{"yarn.lock": {Data: []byte("hello\n")}}
	ctx := context.Background()
	k := FSCacheKey(fsys, func(context.Context, string) (string, error) { return "c1", nil })
	if got, _ := k(ctx, []string{"yarn.lock"}, false); got != sha1Hex("ce013625030ba8dba906f756967f9e9ca394464a") {
		t.Errorf("files key %q", got)
	}
	if got, _ := k(ctx, []string{"yarn.lock"}, true); got != sha1Hex("c1") {
		t.Errorf("files_commits key %q", got)
	}
	// Without commits known, files_commits has no key ("default").
	if got, err := FSCacheKey(fsys, nil)(ctx, []string{"yarn.lock"}, true); got != "" || err != nil {
		t.Errorf("no commits: %q %v", got, err)
	}
}
