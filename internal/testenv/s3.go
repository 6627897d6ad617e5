package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// S3ServerEnv names the S3-compatible server binary the object-storage
// tests start: Versity S3 Gateway (versitygw), built by .ci/s3server.
const S3ServerEnv = "BERTH_S3_SERVER_BINARY"

// S3 starts a fresh S3-compatible server for the test — the binary of
// $BERTH_S3_SERVER_BINARY with its posix backend in a temporary
// directory, listening on a free loopback port — creates an empty bucket
// in it and stops it when the test ends. endpoint is host:port of plain
// HTTP; the server's region is us-east-1. It skips/fails the test when
// the variable is not set.
func S3(t testing.TB) (endpoint, accessKey, secretKey, bucket string) {
	t.Helper()
	bin := S3Server(t)
	if bin == "" {
		return
	}
	accessKey = "berthtest" + randHex(4)
	secretKey = "secret-" + randHex(16)
	bucket = "berth-test-" + randHex(4)
	root := t.TempDir()
	data := filepath.Join(root, "data")
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	// A port taken between picking and binding makes the server exit at
	// once; pick again then.
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		endpoint = freeLoopbackAddr(t)
		lastErr = startS3(t, bin, endpoint, accessKey, secretKey, data, filepath.Join(root, fmt.Sprintf("server-%d.log", attempt)))
		if lastErr == nil {
			break
		}
	}
	if lastErr != nil {
		t.Fatalf("starting the S3 server: %v", lastErr)
	}
	c, err := minio.New(endpoint, &minio.Options{Creds: credentials.NewStaticV4(accessKey, secretKey, ""), Region: "us-east-1"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.MakeBucket(ctx, bucket, minio.MakeBucketOptions{Region: "us-east-1"}); err != nil {
		t.Fatalf("creating bucket %s: %v", bucket, err)
	}
	return endpoint, accessKey, secretKey, bucket
}

// S3Server returns the S3 server binary of $BERTH_S3_SERVER_BINARY, or
// skips/fails the test when it is not set: for a test that starts servers
// in its subtests only.
func S3Server(t testing.TB) string {
	t.Helper()
	bin := os.Getenv(S3ServerEnv)
	if bin == "" {
		Missing(t, "%s is not set (an S3 server binary: bash .ci/s3server OUT builds one)", S3ServerEnv)
		return ""
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%s: %v", S3ServerEnv, err)
	}
	return bin
}

// startS3 runs the server and waits until it answers HTTP as itself (an
// anonymous request is refused, which is an answer; the Server header
// tells it from another process that took the port).
func startS3(t testing.TB, bin, addr, access, secret, data, logPath string) error {
	logf, err := os.Create(logPath)
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, "--port", addr, "--quiet", "posix", data)
	// Credentials through the environment, not the command line.
	cmd.Env = append(os.Environ(), "ROOT_ACCESS_KEY_ID="+access, "ROOT_SECRET_ACCESS_KEY="+secret)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); logf.Close(); close(exited) }()
	stop := func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}
	probe := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(20 * time.Second)
	for {
		select {
		case <-exited:
			b, _ := os.ReadFile(logPath)
			return fmt.Errorf("%s exited: %s", filepath.Base(bin), strings.TrimSpace(string(b)))
		default:
		}
		if resp, err := probe.Get("http://" + addr + "/"); err == nil {
			resp.Body.Close()
			if resp.Header.Get("Server") == "VERSITYGW" {
				t.Cleanup(stop)
				return nil
			}
		}
		if time.Now().After(deadline) {
			stop()
			return fmt.Errorf("%s did not listen on %s within 20 s", filepath.Base(bin), addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func freeLoopbackAddr(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
