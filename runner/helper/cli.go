package helper

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/berthci/berth/runner/network"
)

// TokenEnv is the environment variable the job token reaches the helper
// through (never the command line, which other users can read).
const TokenEnv = "BERTH_JOB_TOKEN"

// Commands are the helper's subcommands with a one-line summary.
var Commands = map[string]string{
	"artifacts-upload":   "archive paths of the project directory and upload them as the job's artifacts",
	"artifacts-download": "download a job's artifacts archive and extract it into the project directory",
	"cache-archive":      "archive paths of the project directory into a local cache file, or upload it to a pre-signed URL",
	"cache-extract":      "extract the first existing local cache file, or the first object of pre-signed URLs, into the project directory",
	"reap":               "signal the processes of a stage (by marker) and their process groups",
	"env-save":           "write the shell's environment and directory to a file (FILE)",
	"env-restore":        "print the shell commands that apply what changed between two env-save files (BEFORE AFTER)",
}

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

// Main runs one helper command (args[0] is its name) and returns the
// process exit code: 0 done, 1 failed, 2 usage.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer, version string) int {
	return Run(ctx, args, stdout, stderr, nil, version)
}

// Run is Main with the API client to use (nil: a new one): a runner
// that runs a file stage in its own process passes its client, and the
// job token with --token.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer, client *network.Client, version string) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: berth helper artifacts-upload|artifacts-download|cache-archive|cache-extract|reap|env-save|env-restore [flags]")
		return 2
	}
	name := args[0]
	switch name {
	case "reap":
		return reapMain(args[1:], stdout, stderr)
	case "env-save", "env-restore":
		want := map[string]int{"env-save": 1, "env-restore": 2}[name]
		if len(args)-1 != want {
			fmt.Fprintf(stderr, "usage: berth helper env-save FILE | env-restore BEFORE AFTER\n")
			return 2
		}
		var err error
		if name == "env-save" {
			err = envSave(args[1])
		} else {
			err = envRestore(stdout, args[1], args[2])
		}
		if err != nil {
			fmt.Fprintf(stderr, "ERROR: %s: %v\n", name, err)
			return 1
		}
		return 0
	}
	fs := flag.NewFlagSet("berth helper "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		url, dir, artName, format, typ, expireIn, tok string
		id, maxSize                                   int64
		paths, excludes, files, urls, keys            multi
		untracked                                     bool
	)
	fs.StringVar(&dir, "dir", ".", "project directory")
	switch name {
	case "artifacts-upload", "artifacts-download":
		fs.StringVar(&url, "url", "", "coordinator URL")
		fs.Int64Var(&id, "id", 0, "job id")
		fs.StringVar(&tok, "token", "", "job token (default: $"+TokenEnv+")")
		if name == "artifacts-upload" {
			fs.StringVar(&artName, "name", "artifacts", "artifact name")
			fs.StringVar(&format, "format", "zip", "artifact format: zip, gzip or raw")
			fs.StringVar(&typ, "type", "", "artifact type (default archive)")
			fs.StringVar(&expireIn, "expire-in", "", "expiry (GitLab duration)")
			fs.Var(&paths, "path", "path or glob to include (repeatable)")
			fs.Var(&excludes, "exclude", "glob to exclude (repeatable)")
			fs.BoolVar(&untracked, "untracked", false, "include files git does not track")
		}
	case "cache-archive":
		fs.Var(&files, "file", "cache archive to write")
		fs.Var(&urls, "url", "pre-signed PUT URL to upload the archive to instead (default: $"+CacheURLsEnv+" when no --file)")
		fs.Var(&keys, "key", "the cache key, for the log")
		fs.Int64Var(&maxSize, "max-size", 0, "do not upload an archive larger than this many bytes (0: no limit)")
		fs.Var(&paths, "path", "path or glob to include (repeatable)")
		fs.BoolVar(&untracked, "untracked", false, "include files git does not track")
	case "cache-extract":
		fs.Var(&files, "file", "cache archive to extract; the first that exists wins (repeatable)")
		fs.Var(&urls, "url", "pre-signed GET URL of a cache archive instead; the first that exists wins (repeatable; default: $"+CacheURLsEnv+", one a line, when no --file)")
		fs.Var(&keys, "key", "the cache key of each --url, for the log (repeatable)")
	default:
		fmt.Fprintf(stderr, "berth helper: unknown command %q\n", name)
		return 2
	}
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	if tok == "" {
		tok = os.Getenv(TokenEnv)
	}
	if (name == "cache-archive" || name == "cache-extract") && len(files) == 0 && len(urls) == 0 {
		for _, u := range strings.Split(os.Getenv(CacheURLsEnv), "\n") {
			if u = strings.TrimSpace(u); u != "" {
				urls = append(urls, u)
			}
		}
	}
	if client == nil {
		client = network.New(network.Options{Version: version})
		// In the job's environment, the runner's TLS files for its
		// coordinator come as GitLab's file variables.
		if f := network.TLSFilesFromEnv(os.Getenv); url != "" && !f.IsZero() {
			if err := client.SetTLS(url, f); err != nil {
				fmt.Fprintf(stderr, "ERROR: %s: %v\n", name, err)
				return 1
			}
		}
	}
	jc := network.JobCredentials{URL: url, ID: id, Token: tok}
	var err error
	switch name {
	case "artifacts-upload":
		if url == "" || id <= 0 || tok == "" {
			err = errors.New("--url, --id and a job token are required")
			break
		}
		err = ArtifactsUpload(ctx, stdout, client, jc, dir, Selection{Paths: paths, Exclude: excludes, Untracked: untracked},
			UploadOptions{Name: artName, Format: format, Type: typ, ExpireIn: expireIn})
	case "artifacts-download":
		if url == "" || id <= 0 || tok == "" {
			err = errors.New("--url, --id and a job token are required")
			break
		}
		err = ArtifactsDownload(ctx, stdout, client, jc, dir)
	case "cache-archive":
		sel := Selection{Paths: paths, Untracked: untracked}
		switch {
		case len(files) == 1 && len(urls) == 0:
			err = CacheArchive(ctx, stdout, files[0], dir, sel)
		case len(urls) == 1 && len(files) == 0:
			key := ""
			if len(keys) > 0 {
				key = keys[0]
			}
			err = RemoteCache{}.Archive(ctx, stdout, urls[0], key, dir, sel, maxSize)
		default:
			err = errors.New("exactly one --file or one --url (or $" + CacheURLsEnv + ") is required")
		}
	case "cache-extract":
		switch {
		case len(files) > 0 && len(urls) == 0:
			err = CacheExtract(ctx, stdout, files, dir)
		case len(urls) > 0 && len(files) == 0:
			err = RemoteCache{}.Extract(ctx, stdout, urls, keys, dir)
		default:
			err = errors.New("--file (local archives) or --url (pre-signed URLs, or $" + CacheURLsEnv + "), not both, is required")
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "ERROR: %s: %v\n", name, err)
		return 1
	}
	return 0
}
