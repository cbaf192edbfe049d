package grpclimit_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/grpclimit"
	"github.com/weir-dev/weir/ops"
	"github.com/weir-dev/weir/quota"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const rules = `
rules:
  - id: health-check
    match: {path: /grpc.health.v1.Health/Check}
    key: [header:X-Api-Key, user]
    limit: 2
    window: 1m
  - id: health-watch
    match: {path: /grpc.health.v1.Health/Watch}
    key: [ip]
    limit: 1
    window: 1m
`

// serve starts a health server behind the interceptors on loopback and
// returns a client for it.
func serve(t *testing.T) (healthpb.HealthClient, *weir.Node) {
	t.Helper()
	rs, err := quota.Parse("rules.yaml", []byte(rules))
	if err != nil {
		t.Fatal(err)
	}
	node, err := weir.New(weir.Config{Rules: rs})
	if err != nil {
		t.Fatal(err)
	}
	lim := grpclimit.Config{Node: node, User: grpclimit.FromMetadata("X-User")}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(lim.Unary()), grpc.ChainStreamInterceptor(lim.Stream()))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cc.Close()
		srv.Stop()
		<-done
		for _, c := range ops.Counts(node) {
			if c.FailOpen != 0 {
				t.Errorf("rule %s: %d fail-open decisions in a run with no fault", c.Rule, c.FailOpen)
			}
		}
		node.Close()
	})
	return healthpb.NewHealthClient(cc), node
}

func TestUnary(t *testing.T) {
	c, _ := serve(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	keyed := metadata.AppendToOutgoingContext(ctx, "x-api-key", "k1")
	for i := range 2 {
		var tr metadata.MD
		if _, err := c.Check(keyed, &healthpb.HealthCheckRequest{}, grpc.Trailer(&tr)); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if got := tr.Get("x-ratelimit-limit"); len(got) != 1 || got[0] != "2" {
			t.Fatalf("call %d: trailer %v", i, tr)
		}
		if got := tr.Get("x-ratelimit-remaining"); len(got) != 1 || got[0] != []string{"1", "0"}[i] {
			t.Fatalf("call %d: trailer %v", i, tr)
		}
		if p := tr.Get("ratelimit-policy"); len(p) != 1 || !strings.Contains(p[0], `"health-check";q=2;w=60`) {
			t.Fatalf("call %d: trailer %v", i, tr)
		}
	}
	var tr metadata.MD
	_, err := c.Check(keyed, &healthpb.HealthCheckRequest{}, grpc.Trailer(&tr))
	st := status.Convert(err)
	if st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "health-check") {
		t.Fatalf("third call: %v", err)
	}
	var retry *errdetails.RetryInfo
	var quotaFailure *errdetails.QuotaFailure
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.RetryInfo:
			retry = d
		case *errdetails.QuotaFailure:
			quotaFailure = d
		}
	}
	if retry == nil || retry.RetryDelay.AsDuration() <= 0 || retry.RetryDelay.AsDuration() > 30*time.Second {
		t.Fatalf("retry info %v, want a delay in (0, 30s] (one token of 2/min)", retry)
	}
	if quotaFailure == nil || len(quotaFailure.Violations) != 1 || quotaFailure.Violations[0].Subject != "rule:health-check" {
		t.Fatalf("quota failure %v", quotaFailure)
	}
	if ra := tr.Get("retry-after"); len(ra) != 1 || ra[0] == "" || ra[0] == "0" {
		t.Fatalf("trailer %v, want retry-after", tr)
	}
	// Another key, and a user when no key is sent, have their own buckets.
	if _, err := c.Check(metadata.AppendToOutgoingContext(ctx, "x-api-key", "k2"), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("other key: %v", err)
	}
	userCtx := metadata.AppendToOutgoingContext(ctx, "x-user", "alice")
	for i := range 3 {
		_, err := c.Check(userCtx, &healthpb.HealthCheckRequest{})
		if want := i < 2; (err == nil) != want {
			t.Fatalf("user call %d: %v", i, err)
		}
	}
}

func TestStream(t *testing.T) {
	c, node := serve(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	first, err := c.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := first.Recv(); err != nil {
		t.Fatalf("first stream: %v", err)
	}
	second, err := c.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = second.Recv()
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("second stream from the same address: %v, want ResourceExhausted", err)
	}
	if tr := second.Trailer(); len(tr.Get("retry-after")) != 1 || len(tr.Get("ratelimit")) != 1 {
		t.Fatalf("second stream trailer %v", tr)
	}
	var rejected uint64
	for _, rc := range ops.Counts(node) {
		if rc.Rule == "health-watch" {
			rejected = rc.Rejected
		}
	}
	if rejected != 1 {
		t.Fatalf("health-watch rejected %d, want 1", rejected)
	}
}

func TestKeyFuncs(t *testing.T) {
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-user", "bob"))
	if got := grpclimit.FromMetadata("X-User")(ctx, "/a.B/C"); got != "bob" {
		t.Errorf("FromMetadata = %q", got)
	}
	if got := grpclimit.FromMetadata("x-none")(ctx, "/a.B/C"); got != "" {
		t.Errorf("FromMetadata of a missing key = %q", got)
	}
	if got := grpclimit.FullMethod()(ctx, "/a.B/C"); got != "/a.B/C" {
		t.Errorf("FullMethod = %q", got)
	}
	if got := grpclimit.PeerAddress()(ctx, "/a.B/C"); got != "" {
		t.Errorf("PeerAddress without a peer = %q", got)
	}
}

// TestStreamConcurrency: a concurrency rule's slot is held while a stream's
// handler runs and released when it returns.
func TestStreamConcurrency(t *testing.T) {
	rs, err := quota.Parse("rules.yaml", []byte(`
rules:
  - id: watch-open
    match: {path: /grpc.health.v1.Health/Watch}
    key: [global]
    algorithm: concurrency
    limit: 1
    window: 1s
`))
	if err != nil {
		t.Fatal(err)
	}
	node, err := weir.New(weir.Config{Rules: rs})
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	lim := grpclimit.Config{Node: node}
	srv := grpc.NewServer(grpc.ChainStreamInterceptor(lim.Stream()))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	defer func() { srv.Stop(); <-done }()
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	c := healthpb.NewHealthClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	open := func(ctx context.Context) error {
		s, err := c.Watch(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			return err
		}
		_, err = s.Recv()
		return err
	}
	firstCtx, closeFirst := context.WithCancel(ctx)
	if err := open(firstCtx); err != nil {
		t.Fatalf("first stream: %v", err)
	}
	if err := open(ctx); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("second stream while the first is open: %v, want ResourceExhausted", err)
	}
	closeFirst()
	// The first handler returns once its cancellation reaches the server.
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := open(ctx)
		if err == nil {
			break
		}
		if status.Code(err) != codes.ResourceExhausted || time.Now().After(deadline) {
			t.Fatalf("stream after the first closed: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, rc := range ops.Counts(node) {
		if rc.FailOpen != 0 {
			t.Errorf("rule %s: %d fail-open decisions", rc.Rule, rc.FailOpen)
		}
	}
}

// TestUnaryReleasesOnEveryPath: the unary interceptor gives a concurrency
// slot back whatever way the handler ends: an error, a panic, a client
// that gave up. With one slot, the call after each is admitted.
func TestUnaryReleasesOnEveryPath(t *testing.T) {
	rs, err := quota.Parse("rules.yaml", []byte(`
rules:
  - id: one-at-a-time
    key: [global]
    algorithm: concurrency
    limit: 1
    window: 1m
`))
	if err != nil {
		t.Fatal(err)
	}
	node, err := weir.New(weir.Config{Rules: rs})
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	unary := grpclimit.Config{Node: node}.Unary()
	info := &grpc.UnaryServerInfo{FullMethod: "/a.B/C"}
	call := func(ctx context.Context, h grpc.UnaryHandler) (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = status.Error(codes.Internal, "panic")
			}
		}()
		_, err = unary(ctx, nil, info, h)
		return err
	}
	held, entered := make(chan struct{}), make(chan struct{})
	hold := func(ctx context.Context, _ any) (any, error) { close(entered); <-held; return nil, nil }
	// One call holds the slot: a second is refused.
	go func() { _ = call(context.Background(), hold) }()
	<-entered
	if err := call(context.Background(), func(context.Context, any) (any, error) { return nil, nil }); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a second call while one holds the slot: %v, want ResourceExhausted", err)
	}
	close(held)
	ends := map[string]grpc.UnaryHandler{
		"error": func(context.Context, any) (any, error) { return nil, status.Error(codes.Unavailable, "upstream down") },
		"panic": func(context.Context, any) (any, error) { panic("handler bug") },
		"cancel": func(ctx context.Context, _ any) (any, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		},
	}
	for _, end := range []string{"error", "panic", "cancel"} {
		ctx, cancel := context.WithCancel(context.Background())
		if end == "cancel" {
			time.AfterFunc(10*time.Millisecond, cancel)
		}
		deadline := time.Now().Add(5 * time.Second)
		var err error
		for err = call(ctx, ends[end]); status.Code(err) == codes.ResourceExhausted && time.Now().Before(deadline); err = call(ctx, ends[end]) {
			time.Sleep(time.Millisecond) // the holding call is still returning
		}
		cancel()
		if status.Code(err) == codes.ResourceExhausted {
			t.Fatalf("%s: refused: an earlier call's slot was not released", end)
		}
		if err := call(context.Background(), func(context.Context, any) (any, error) { return nil, nil }); err != nil {
			t.Fatalf("after a call that ended by %s: %v, want the slot free", end, err)
		}
	}
}
