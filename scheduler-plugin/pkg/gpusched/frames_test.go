package gpusched

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/gpusched/gpusched/scheduler-plugin/gen/scheduling/v1"
)

// serveFrames serves srv (a fake core) in frames on a Unix socket of the test's own, one goroutine
// per connection as the Python core does, and returns the plugin's address for it and the count of
// connections accepted.
func serveFrames(t *testing.T, srv pb.SchedulingServer) (string, *atomic.Int32) {
	t.Helper()
	lis, address := listenUnix(t)
	accepted := &atomic.Int32{}
	go func() {
		for {
			conn, err := lis.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			go func() {
				defer func() { _ = conn.Close() }()
				stop := context.AfterFunc(t.Context(), func() { _ = conn.Close() })
				defer stop()
				for {
					req, err := readFrame(conn)
					if err != nil {
						return
					}
					if err := answerFrame(conn, srv, req); err != nil {
						return
					}
				}
			}()
		}
	}()
	return address, accepted
}

// listenUnix listens on a Unix socket of the test's own, closed when the test ends (as
// grpc.Server.Stop: connections closed by their handlers, handlers that ignore it not awaited).
func listenUnix(t *testing.T) (net.Listener, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "core.sock")
	lis, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lis.Close() })
	return lis, "unix://" + path
}

// unaryMethods are the fake core's unary rpcs by Method: decode the request, call srv.
func unaryMethods(srv pb.SchedulingServer) map[pb.Method]func(context.Context, []byte) (proto.Message, error) {
	return map[pb.Method]func(context.Context, []byte) (proto.Message, error){
		pb.Method_METHOD_HELLO:          served(srv.Hello),
		pb.Method_METHOD_PRE_FILTER:     served(srv.PreFilter),
		pb.Method_METHOD_JUDGE_GROUPS:   served(srv.JudgeGroups),
		pb.Method_METHOD_FILTER_WHAT_IF: served(srv.FilterWhatIf),
		pb.Method_METHOD_RESERVE:        served(srv.Reserve),
		pb.Method_METHOD_RESERVE_BATCH:  served(srv.ReserveBatch),
		pb.Method_METHOD_UNRESERVE:      served(srv.Unreserve),
		pb.Method_METHOD_PERMITTED:      served(srv.Permitted),
	}
}

// served adapts one of srv's unary methods to a frame's payload.
func served[Req any, PReq interface {
	*Req
	proto.Message
}, Rep proto.Message](method func(context.Context, PReq) (Rep, error)) func(context.Context, []byte) (proto.Message, error) {
	return func(ctx context.Context, payload []byte) (proto.Message, error) {
		in := PReq(new(Req))
		if err := proto.Unmarshal(payload, in); err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		return method(ctx, in)
	}
}

// answerFrame calls srv's method for one request frame and writes its reply frames.
func answerFrame(conn net.Conn, srv pb.SchedulingServer, req frame) error {
	if pb.Method(req.kind) == pb.Method_METHOD_WATCH_REQUEUE {
		in := &pb.WatchRequeueRequest{}
		if err := proto.Unmarshal(req.payload, in); err != nil {
			return writeStatus(conn, req.call, status.Error(codes.InvalidArgument, err.Error()))
		}
		if err := srv.WatchRequeue(in, &frameSender{conn: conn, call: req.call}); err != nil {
			return writeStatus(conn, req.call, err)
		}
		return writeFrame(conn, req.call, uint8(codes.OK), 0, nil)
	}
	serve, ok := unaryMethods(srv)[pb.Method(req.kind)]
	if !ok {
		return writeStatus(conn, req.call, status.Errorf(codes.Unimplemented, "method %d", req.kind))
	}
	reply, err := serve(context.Background(), req.payload)
	if err != nil {
		return writeStatus(conn, req.call, err)
	}
	body, err := proto.Marshal(reply)
	if err != nil {
		return err
	}
	return writeFrame(conn, req.call, uint8(codes.OK), 0, body)
}

func writeStatus(conn net.Conn, call uint32, err error) error {
	st := status.Convert(err)
	return writeFrame(conn, call, uint8(st.Code()), 0, []byte(st.Message()))
}

// frameSender is the fake's side of a WatchRequeue stream: each batch a frame with frameMore.
type frameSender struct {
	grpc.ServerStream // only Send and Context are used by the fakes
	conn              net.Conn
	call              uint32
}

func (s *frameSender) Send(batch *pb.RequeueBatch) error {
	body, err := proto.Marshal(batch)
	if err != nil {
		return err
	}
	return writeFrame(s.conn, s.call, uint8(codes.OK), frameMore, body)
}

func (s *frameSender) Context() context.Context { return context.Background() }

// slowCore answers Hello after its delay, and says what it was asked.
type slowCore struct {
	fakeCore
	delay time.Duration
}

func (s *slowCore) Hello(_ context.Context, r *pb.HelloRequest) (*pb.HelloReply, error) {
	time.Sleep(s.delay)
	if r.GetApiVersion() != APIVersion {
		return nil, status.Errorf(codes.FailedPrecondition, "api v%d", r.GetApiVersion())
	}
	return &pb.HelloReply{CoreVersion: r.GetPluginVersion()}, nil
}

func TestTheFrameClientReadsTheCoresRepliesAndStatuses(t *testing.T) {
	address, _ := serveFrames(t, &slowCore{})
	client, err := newFrameClient(address)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = client.Close() }()
	tests := []struct {
		name     string
		version  uint32
		wantCode codes.Code
		wantCore string
		wantMsg  string
	}{
		{"answered", APIVersion, codes.OK, "echo", ""},
		{"the core's own status", APIVersion + 1, codes.FailedPrecondition, "", fmt.Sprintf("api v%d", APIVersion+1)},
		{"the connection lives on after a status", APIVersion, codes.OK, "echo", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			reply, err := client.Hello(ctx, &pb.HelloRequest{ApiVersion: tt.version, PluginVersion: "echo"})
			if st := status.Convert(err); st.Code() != tt.wantCode || st.Message() != tt.wantMsg {
				t.Fatalf("status %v %q, want %v %q", st.Code(), st.Message(), tt.wantCode, tt.wantMsg)
			}
			if reply.GetCoreVersion() != tt.wantCore {
				t.Fatalf("core version %q, want %q", reply.GetCoreVersion(), tt.wantCore)
			}
		})
	}
}

func TestTheFrameClientKeepsOneConnectionForSerialCallsAndOneEachForConcurrentOnes(t *testing.T) {
	address, accepted := serveFrames(t, &slowCore{delay: 20 * time.Millisecond})
	client, _ := newFrameClient(address)
	defer func() { _ = client.Close() }()
	for range 5 {
		if _, err := client.Hello(context.Background(), &pb.HelloRequest{ApiVersion: APIVersion}); err != nil {
			t.Fatal(err)
		}
	}
	if n := accepted.Load(); n != 1 {
		t.Fatalf("5 calls one after another opened %d connections, want 1", n)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			want := fmt.Sprintf("caller-%d", i)
			reply, err := client.Hello(context.Background(), &pb.HelloRequest{ApiVersion: APIVersion, PluginVersion: want})
			if err == nil && reply.GetCoreVersion() != want {
				err = fmt.Errorf("caller %q got the reply meant for %q", want, reply.GetCoreVersion())
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

func TestTheFrameClientWordsWhatNothingAnswered(t *testing.T) {
	slow, _ := serveFrames(t, &slowCore{delay: 300 * time.Millisecond})
	tests := []struct {
		name    string
		address func(t *testing.T) string
		timeout time.Duration
		want    codes.Code
	}{
		{"no core listening", func(t *testing.T) string { return "unix://" + filepath.Join(t.TempDir(), "none.sock") },
			time.Second, codes.Unavailable},
		{"past the deadline", func(*testing.T) string { return slow }, 50 * time.Millisecond, codes.DeadlineExceeded},
		{"a reply over the size limit", oversizedReplier, time.Second, codes.ResourceExhausted},
		{"the core hangs up mid-call", hangUp, time.Second, codes.Unavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client, _ := newFrameClient(tt.address(t))
			defer func() { _ = client.Close() }()
			ctx, cancel := context.WithTimeout(context.Background(), tt.timeout)
			defer cancel()
			_, err := client.Hello(ctx, &pb.HelloRequest{ApiVersion: APIVersion})
			if got := status.Code(err); got != tt.want {
				t.Fatalf("status %v (%v), want %v", got, err, tt.want)
			}
			if tt.name == "past the deadline" { // the late reply must not be read as the next call's
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				if _, err := client.Hello(ctx, &pb.HelloRequest{ApiVersion: APIVersion}); err != nil {
					t.Fatalf("the call after a timed-out one: %v", err)
				}
			}
		})
	}
}

// oversizedReplier listens and answers any request with a header announcing 1 GiB.
func oversizedReplier(t *testing.T) string {
	return rawCore(t, func(conn net.Conn, req frame) {
		var header [frameHeaderBytes]byte
		binary.BigEndian.PutUint32(header[0:4], 1<<30)
		binary.BigEndian.PutUint32(header[4:8], req.call)
		_, _ = conn.Write(header[:])
	})
}

// hangUp listens and closes each connection once a request arrived.
func hangUp(t *testing.T) string {
	return rawCore(t, func(net.Conn, frame) {})
}

func rawCore(t *testing.T, answer func(net.Conn, frame)) string {
	t.Helper()
	lis, address := listenUnix(t)
	go func() {
		for {
			conn, err := lis.Accept()
			if err != nil {
				return
			}
			if req, err := readFrame(conn); err == nil {
				answer(conn, req)
			}
			_ = conn.Close()
		}
	}()
	return address
}

func TestAFrameClientAddressIsUnixOrHostPort(t *testing.T) {
	tests := []struct {
		address, network, target string
	}{
		{"unix:///run/gpusched/scheduling.sock", "unix", "/run/gpusched/scheduling.sock"},
		{"unix:relative.sock", "unix", "relative.sock"},
		{"127.0.0.1:7443", "tcp", "127.0.0.1:7443"},
	}
	for _, tt := range tests {
		c, err := newFrameClient(tt.address)
		if err != nil || c.network != tt.network || c.address != tt.target {
			t.Errorf("%q: %v %q %q, want %q %q", tt.address, err, c.network, c.address, tt.network, tt.target)
		}
	}
	if _, err := newFrameClient("scheduling.sock"); err == nil {
		t.Errorf("a bare path was accepted")
	}
}
