package nesting_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/berthci/berth/nesting"
	"github.com/berthci/berth/nesting/internal/pb"
	"github.com/berthci/berth/nesting/nestingtest"
)

// Upstream's error values as GitLab Runner's nesting client declares them:
// a status error matches them with errors.Is only if code and message are
// equal.
var (
	upstreamNotInitialized     = status.Error(codes.FailedPrecondition, "not initialized")
	upstreamAlreadyInitialized = status.Error(codes.FailedPrecondition, "already initialized")
)

// socketPath is a fresh socket path short enough for sun_path (108 bytes),
// which t.TempDir() under long test names is not.
func socketPath(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "nest")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "nesting.sock")
}

// daemon is a Server over hv served on a real unix socket.
type daemon struct {
	path   string
	client *nesting.Client // Berth's client
	raw    pb.NestingClient
	stop   func() error // ends Serve and returns its result
}

func serve(t *testing.T, hv nesting.Hypervisor) *daemon {
	t.Helper()
	path := socketPath(t)
	l, err := nesting.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- nesting.NewServer(hv, nil).Serve(ctx, l) }()
	var once sync.Once
	var serveErr error
	stop := func() error {
		once.Do(func() { cancel(); serveErr = <-done })
		return serveErr
	}
	t.Cleanup(func() { stop() })

	c, err := nesting.Dial(tctx(t), "unix://"+path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &daemon{path: path, client: c, raw: pb.NewNestingClient(conn), stop: stop}
}

func tctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func slot(n int32) *int32 { return &n }

func initialize(t *testing.T, d *daemon) {
	t.Helper()
	if err := d.client.Init(tctx(t), []byte(`{}`)); err != nil {
		t.Fatalf("Init: %v", err)
	}
}

// wantStatus checks a raw gRPC error's code and exact message.
func wantStatus(t *testing.T, what string, err error, code codes.Code, msg string) {
	t.Helper()
	st, _ := status.FromError(err)
	if st.Code() != code || (msg != "" && st.Message() != msg) {
		t.Errorf("%s: got %v, want %v %q", what, err, code, msg)
	}
}

func TestCallsBeforeInitAreNotInitialized(t *testing.T) {
	f := &nestingtest.Fake{}
	d := serve(t, f)
	ctx := tctx(t)

	// On the wire, exactly as upstream.
	_, err := d.raw.Create(ctx, &pb.CreateRequest{Name: "img", Slot: slot(0)})
	wantStatus(t, "Create", err, codes.FailedPrecondition, "not initialized")
	if !errors.Is(err, upstreamNotInitialized) {
		t.Errorf("Create: %v does not match upstream's ErrNotInitialized", err)
	}
	_, err = d.raw.Delete(ctx, &pb.DeleteRequest{Id: "nesting-abcdefgh"})
	wantStatus(t, "Delete", err, codes.FailedPrecondition, "not initialized")
	_, err = d.raw.List(ctx, &pb.ListRequest{})
	wantStatus(t, "List", err, codes.FailedPrecondition, "not initialized")

	// Through the client, as sentinels.
	if _, _, err := d.client.Create(ctx, "img", nil); !errors.Is(err, nesting.ErrNotInitialized) {
		t.Errorf("client Create = %v, want ErrNotInitialized", err)
	}
	if err := d.client.Delete(ctx, "nesting-abcdefgh"); !errors.Is(err, nesting.ErrNotInitialized) {
		t.Errorf("client Delete = %v, want ErrNotInitialized", err)
	}
	if _, err := d.client.List(ctx); !errors.Is(err, nesting.ErrNotInitialized) || status.Code(err) != codes.FailedPrecondition {
		t.Errorf("client List = %v, want ErrNotInitialized with code FailedPrecondition", err)
	}
	// The Fake fails on calls before Init: none reached it.
	if len(f.VMs()) != 0 {
		t.Errorf("the hypervisor holds %v", f.VMs())
	}
}

func TestSecondInitIsAlreadyInitialized(t *testing.T) {
	f := &nestingtest.Fake{}
	d := serve(t, f)
	ctx := tctx(t)
	if _, err := d.raw.Init(ctx, &pb.InitRequest{Config: []byte(`{"a":1}`)}); err != nil {
		t.Fatal(err)
	}
	_, err := d.raw.Init(ctx, &pb.InitRequest{Config: []byte(`{"a":2}`)})
	wantStatus(t, "second Init", err, codes.FailedPrecondition, "already initialized")
	if !errors.Is(err, upstreamAlreadyInitialized) {
		t.Errorf("second Init: %v does not match upstream's ErrAlreadyInitialized", err)
	}
	if err := d.client.Init(ctx, []byte(`{}`)); !errors.Is(err, nesting.ErrAlreadyInitialized) {
		t.Errorf("client Init = %v, want ErrAlreadyInitialized", err)
	}
	if inits, _ := f.Calls(); inits != 1 || string(f.Config()) != `{"a":1}` {
		t.Errorf("hypervisor: %d inits with %s, want 1 with the first config", inits, f.Config())
	}
}

func TestRefusedConfigLeavesTheDaemonUninitialized(t *testing.T) {
	f := &nestingtest.Fake{}
	d := serve(t, f)
	ctx := tctx(t)
	err := d.client.Init(ctx, []byte(`not json`))
	if err == nil || errors.Is(err, nesting.ErrAlreadyInitialized) || errors.Is(err, nesting.ErrNotInitialized) {
		t.Fatalf("Init with a refused config = %v, want the hypervisor's error", err)
	}
	if !strings.Contains(err.Error(), "not a JSON object") {
		t.Errorf("Init error %q does not carry the hypervisor's reason", err)
	}
	if _, err := d.client.List(ctx); !errors.Is(err, nesting.ErrNotInitialized) {
		t.Errorf("List after a refused Init = %v, want ErrNotInitialized", err)
	}
	if err := d.client.Init(ctx, []byte(`{}`)); err != nil {
		t.Errorf("Init after a refused one: %v", err)
	}
}

func TestCreateWithSlotStompsTheSlotsVM(t *testing.T) {
	f := &nestingtest.Fake{}
	d := serve(t, f)
	initialize(t, d)
	ctx := tctx(t)

	// A free slot: no stompedVmId on the wire (the field is optional).
	resp, err := d.raw.Create(ctx, &pb.CreateRequest{Name: "debian", Slot: slot(1)})
	if err != nil {
		t.Fatal(err)
	}
	first := resp.GetVm()
	if resp.StompedVmId != nil {
		t.Errorf("Create in a free slot set stompedVmId %q", *resp.StompedVmId)
	}
	if !nesting.ValidID(first.GetId()) || first.GetName() != "debian" || first.GetAddr() == "" {
		t.Errorf("Create returned %v", first)
	}

	// The same slot: the old VM is deleted and named.
	second, stomped, err := d.client.Create(ctx, "debian", slot(1))
	if err != nil {
		t.Fatal(err)
	}
	if stomped != first.GetId() {
		t.Errorf("stomped = %q, want the slot's VM %s", stomped, first.GetId())
	}
	if got := f.VMs(); len(got) != 1 || got[0] != second {
		t.Errorf("hypervisor holds %v, want only the new %v", got, second)
	}

	// Another slot, and no slot: nothing stomped.
	third, stomped, err := d.client.Create(ctx, "alpine", slot(2))
	if err != nil || stomped != "" {
		t.Fatalf("Create in slot 2 = %v, stomped %q", err, stomped)
	}
	fourth, stomped, err := d.client.Create(ctx, "alpine", nil)
	if err != nil || stomped != "" {
		t.Fatalf("Create without slot = %v, stomped %q", err, stomped)
	}
	// The new VM of slot 1 is recorded: stomping it again names it.
	_, stomped, err = d.client.Create(ctx, "debian", slot(1))
	if err != nil || stomped != second.ID {
		t.Fatalf("Create in slot 1 again = %v, stomped %q, want %s", err, stomped, second.ID)
	}
	if got := len(f.VMs()); got != 3 {
		t.Errorf("hypervisor holds %d VMs, want 3 (slot 1, slot 2 %s, no slot %s)", got, third.ID, fourth.ID)
	}
}

func TestDeleteClearsTheSlot(t *testing.T) {
	f := &nestingtest.Fake{}
	d := serve(t, f)
	initialize(t, d)
	ctx := tctx(t)
	vm, _, err := d.client.Create(ctx, "debian", slot(3))
	if err != nil {
		t.Fatal(err)
	}
	if err := d.client.Delete(ctx, vm.ID); err != nil {
		t.Fatal(err)
	}
	if _, stomped, err := d.client.Create(ctx, "debian", slot(3)); err != nil || stomped != "" {
		t.Errorf("Create in a slot whose VM was deleted = %v, stomped %q, want nothing stomped", err, stomped)
	}
}

// Upstream's Create fails for good once the slot's VM is gone from the
// hypervisor by other means (its Delete errors and the slot entry stays).
// Berth treats such a VM as deleted.
func TestStompOfAVMTheHypervisorLostDoesNotBlockTheSlot(t *testing.T) {
	f := &nestingtest.Fake{}
	d := serve(t, f)
	initialize(t, d)
	ctx := tctx(t)
	vm, _, err := d.client.Create(ctx, "debian", slot(0))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Delete(ctx, vm.ID); err != nil { // behind the daemon's back
		t.Fatal(err)
	}
	next, stomped, err := d.client.Create(ctx, "debian", slot(0))
	if err != nil {
		t.Fatalf("Create in the slot of a lost VM: %v", err)
	}
	if stomped != vm.ID {
		t.Errorf("stomped = %q, want %s", stomped, vm.ID)
	}
	if got := f.VMs(); len(got) != 1 || got[0] != next {
		t.Errorf("hypervisor holds %v, want %v", got, next)
	}
}

func TestDeleteUnknownIsNotFound(t *testing.T) {
	d := serve(t, &nestingtest.Fake{})
	initialize(t, d)
	_, err := d.raw.Delete(tctx(t), &pb.DeleteRequest{Id: "nesting-00000000"})
	wantStatus(t, "Delete", err, codes.NotFound, "")
	if err := d.client.Delete(tctx(t), "nesting-00000000"); !errors.Is(err, nesting.ErrNotFound) {
		t.Errorf("client Delete = %v, want ErrNotFound", err)
	}
}

// foreign adds to List a VM of another tool, without the nesting- prefix.
type foreign struct{ *nestingtest.Fake }

func (f foreign) List(ctx context.Context) ([]nesting.VirtualMachine, error) {
	vms, err := f.Fake.List(ctx)
	return append(vms, nesting.VirtualMachine{ID: "builder-1", Name: "x", Addr: "y"}), err
}

func TestListReturnsOnlyPrefixedVMs(t *testing.T) {
	f := &nestingtest.Fake{}
	d := serve(t, foreign{f})
	initialize(t, d)
	ctx := tctx(t)
	a, _, err := d.client.Create(ctx, "debian", nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := d.client.Create(ctx, "alpine", slot(0))
	if err != nil {
		t.Fatal(err)
	}
	vms, err := d.client.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []nesting.VirtualMachine{a, b}
	slices.SortFunc(want, func(x, y nesting.VirtualMachine) int { return strings.Compare(x.ID, y.ID) })
	if !slices.Equal(vms, want) {
		t.Errorf("List = %v, want %v", vms, want)
	}
}

func TestShutdownStopsVMsAndClearsInit(t *testing.T) {
	f := &nestingtest.Fake{}
	d := serve(t, f)
	initialize(t, d)
	ctx := tctx(t)
	if _, _, err := d.client.Create(ctx, "debian", slot(0)); err != nil {
		t.Fatal(err)
	}
	if err := d.client.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if len(f.VMs()) != 0 || f.Initialized() {
		t.Errorf("after Shutdown the hypervisor holds %v, initialized %v", f.VMs(), f.Initialized())
	}
	if _, err := d.client.List(ctx); !errors.Is(err, nesting.ErrNotInitialized) {
		t.Errorf("List after Shutdown = %v, want ErrNotInitialized", err)
	}
	initialize(t, d)
	// Slots are forgotten with their VMs.
	if _, stomped, err := d.client.Create(ctx, "debian", slot(0)); err != nil || stomped != "" {
		t.Errorf("Create after Shutdown and Init = %v, stomped %q", err, stomped)
	}
}

// Upstream answers Shutdown on an uninitialized daemon with
// FailedPrecondition "already initialized", a slip: Berth keeps the code and
// says "not initialized".
func TestShutdownBeforeInitIsNotInitializedNotUpstreamsAlreadyInitialized(t *testing.T) {
	f := &nestingtest.Fake{}
	d := serve(t, f)
	_, err := d.raw.Shutdown(tctx(t), &pb.ShutdownRequest{})
	wantStatus(t, "Shutdown", err, codes.FailedPrecondition, "not initialized")
	if _, shutdowns := f.Calls(); shutdowns != 0 {
		t.Errorf("the hypervisor was shut down %d times", shutdowns)
	}
}

func TestConcurrentCreatesOnOneSlotLeaveOneVM(t *testing.T) {
	f := &nestingtest.Fake{CreateDelay: 10 * time.Millisecond}
	d := serve(t, f)
	initialize(t, d)
	ctx := tctx(t)
	const n = 8
	var (
		wg      sync.WaitGroup
		created [n]nesting.VirtualMachine
		stomped [n]string
		errs    [n]error
	)
	for i := range n {
		wg.Go(func() { created[i], stomped[i], errs[i] = d.client.Create(ctx, "debian", slot(5)) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("Create %d: %v", i, err)
		}
	}
	vms := f.VMs()
	if len(vms) != 1 {
		t.Fatalf("hypervisor holds %d VMs after %d Creates on one slot, want 1: %v", len(vms), n, vms)
	}
	// Every VM but the survivor was stomped, exactly once, by one Create.
	var gotStomped, wantStomped []string
	for i := range n {
		if stomped[i] != "" {
			gotStomped = append(gotStomped, stomped[i])
		}
		if created[i].ID != vms[0].ID {
			wantStomped = append(wantStomped, created[i].ID)
		}
	}
	slices.Sort(gotStomped)
	slices.Sort(wantStomped)
	if !slices.Equal(gotStomped, wantStomped) {
		t.Errorf("stomped %v, want %v", gotStomped, wantStomped)
	}
	// The survivor is the slot's VM.
	if _, s, err := d.client.Create(ctx, "debian", slot(5)); err != nil || s != vms[0].ID {
		t.Errorf("next Create stomped %q (%v), want %s", s, err, vms[0].ID)
	}
}

func TestCreateWaitingForItsSlotHonoursContext(t *testing.T) {
	f := &nestingtest.Fake{CreateDelay: time.Hour}
	srv := nesting.NewServer(f, nil)
	if err := srv.Init(tctx(t), nil); err != nil {
		t.Fatal(err)
	}
	long, cancelLong := context.WithCancel(context.Background())
	defer cancelLong()
	go srv.Create(long, "debian", slot(1))
	time.Sleep(20 * time.Millisecond) // let it take the slot
	short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, _, err := srv.Create(short, "debian", slot(1)); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Create on a busy slot = %v, want DeadlineExceeded", err)
	}
}

func TestLazyInitHelpers(t *testing.T) {
	f := &nestingtest.Fake{}
	d := serve(t, f)
	ctx := tctx(t)
	cfg := []byte(`{"image_directory":"/images"}`)

	vms, err := d.client.ListInitialized(ctx, cfg)
	if err != nil || len(vms) != 0 {
		t.Fatalf("ListInitialized = %v, %v", vms, err)
	}
	if string(f.Config()) != string(cfg) {
		t.Errorf("hypervisor config %s, want %s", f.Config(), cfg)
	}
	if err := d.client.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}

	// Racing workers: one Init wins, the others see "already initialized"
	// and carry on.
	const n = 6
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { _, _, errs[i] = d.client.CreateInitialized(ctx, cfg, "debian", slot(int32(i))) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("CreateInitialized %d: %v", i, err)
		}
	}
	if inits, _ := f.Calls(); inits != 2 {
		t.Errorf("hypervisor initialized %d times, want 2 (once per lifetime)", inits)
	}
	if got := len(f.VMs()); got != n {
		t.Errorf("hypervisor holds %d VMs, want %d", got, n)
	}

	// A refused config is reported.
	if err := d.client.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	_, _, err = d.client.CreateInitialized(ctx, []byte("[1]"), "debian", nil)
	if err == nil || !strings.Contains(err.Error(), "initializing nesting daemon") {
		t.Errorf("CreateInitialized with a refused config = %v", err)
	}
}

func TestServeEndsWithContextAndShutsTheHypervisorDown(t *testing.T) {
	f := &nestingtest.Fake{}
	d := serve(t, f)
	initialize(t, d)
	if _, _, err := d.client.Create(tctx(t), "debian", nil); err != nil {
		t.Fatal(err)
	}
	if err := d.stop(); err != nil {
		t.Fatalf("Serve = %v, want nil after its context ended", err)
	}
	if _, shutdowns := f.Calls(); shutdowns != 1 || len(f.VMs()) != 0 {
		t.Errorf("hypervisor: %d shutdowns, VMs %v; want 1 and none", shutdowns, f.VMs())
	}
	if _, err := os.Lstat(d.path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket file after Serve: %v, want it removed", err)
	}
}

func TestListen(t *testing.T) {
	t.Run("CreatesParentDirsPrivate", func(t *testing.T) {
		path := filepath.Join(filepath.Dir(socketPath(t)), "a", "b", "nesting.sock")
		l, err := nesting.Listen(path)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		fi, err := os.Stat(filepath.Dir(path))
		if err != nil {
			t.Fatal(err)
		}
		if perm := fi.Mode().Perm(); perm != 0o700 {
			t.Errorf("created directory mode %o, want 700", perm)
		}
	})
	t.Run("RemovesStaleSocket", func(t *testing.T) {
		path := socketPath(t)
		stale, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		stale.(*net.UnixListener).SetUnlinkOnClose(false)
		stale.Close() // a daemon that died: the file stays, nobody listens
		l, err := nesting.Listen(path)
		if err != nil {
			t.Fatalf("Listen over a stale socket: %v", err)
		}
		l.Close()
		if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("socket file after Close: %v, want it removed", err)
		}
	})
	t.Run("RefusesLiveDaemon", func(t *testing.T) {
		path := socketPath(t)
		l, err := nesting.Listen(path)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		if l2, err := nesting.Listen(path); err == nil || !strings.Contains(err.Error(), "already listening") {
			t.Errorf("second Listen = %v", err)
			if l2 != nil {
				l2.Close()
			}
		}
	})
	t.Run("RefusesNonSocketFile", func(t *testing.T) {
		path := socketPath(t)
		if err := os.WriteFile(path, []byte("keep me"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := nesting.Listen(path); err == nil {
			t.Error("Listen over a regular file succeeded")
		}
		if b, _ := os.ReadFile(path); string(b) != "keep me" {
			t.Error("Listen changed a regular file")
		}
	})
}

func TestDialReportsAnAbsentDaemon(t *testing.T) {
	path := socketPath(t)
	_, err := nesting.Dial(tctx(t), "unix://"+path)
	if err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("Dial to no daemon = %v, want an error naming %s", err, path)
	}
}

// WithDialer reaches a daemon whose socket path only the dialer knows, as
// the fleeting connector does through SSH.
func TestDialWithDialerTunnels(t *testing.T) {
	d := serve(t, &nestingtest.Fake{})
	const remote = "/Users/ec2-user/Library/Application Support/nesting.sock"
	var mu sync.Mutex
	var asked []string
	tunnel := func(ctx context.Context, network, addr string) (net.Conn, error) {
		mu.Lock()
		asked = append(asked, network+" "+addr)
		mu.Unlock()
		if network != "unix" || addr != remote {
			return nil, fmt.Errorf("no such socket on the instance: %s %s", network, addr)
		}
		var dl net.Dialer
		return dl.DialContext(ctx, "unix", d.path)
	}
	c, err := nesting.Dial(tctx(t), "unix://"+remote, nesting.WithDialer(tunnel))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.ListInitialized(tctx(t), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(asked) == 0 || asked[0] != "unix "+remote {
		t.Errorf("dialer asked for %q", asked)
	}
}

func TestNewID(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		id := nesting.NewID()
		if !nesting.ValidID(id) {
			t.Fatalf("NewID() = %q, not a valid id", id)
		}
		if seen[id] {
			t.Fatalf("NewID() repeated %q", id)
		}
		seen[id] = true
	}
	for _, id := range []string{"", "nesting-", "nesting-abc", "nesting-ABCDEFGH", "nesting-abcdefghi", "nestin-abcdefgh", "nesting-abcd_fgh"} {
		if nesting.ValidID(id) {
			t.Errorf("ValidID(%q) = true", id)
		}
	}
}
