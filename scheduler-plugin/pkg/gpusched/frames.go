package gpusched

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/gpusched/gpusched/scheduler-plugin/gen/scheduling/v1"
)

// The plugin service's wire (gpusched_api/scheduling/frames.py has the whole contract): a 12-byte
// header — payload length, call id, method (request) or status code (reply, gRPC's numbers),
// flags, two zero bytes; big-endian — then the protobuf message, or a status's UTF-8 message.
// A streaming reply sets frameMore on each message and ends with a frame without it.
const (
	frameHeaderBytes = 12
	frameMore        = 0x01
	maxIdleConns     = 16 // connections kept for reuse; busier moments dial more, then close them
)

// rpcName is the service's name of a method (metrics, messages).
func rpcName(method pb.Method) string {
	switch method {
	case pb.Method_METHOD_HELLO:
		return "Hello"
	case pb.Method_METHOD_PRE_FILTER:
		return "PreFilter"
	case pb.Method_METHOD_JUDGE_GROUPS:
		return "JudgeGroups"
	case pb.Method_METHOD_FILTER_WHAT_IF:
		return "FilterWhatIf"
	case pb.Method_METHOD_RESERVE:
		return "Reserve"
	case pb.Method_METHOD_RESERVE_BATCH:
		return "ReserveBatch"
	case pb.Method_METHOD_UNRESERVE:
		return "Unreserve"
	case pb.Method_METHOD_PERMITTED:
		return "Permitted"
	case pb.Method_METHOD_WATCH_REQUEUE:
		return "WatchRequeue"
	}
	return method.String()
}

// schedulingClient is what the plugin asks of the core: one method per rpc of the service.
type schedulingClient interface {
	Hello(context.Context, *pb.HelloRequest) (*pb.HelloReply, error)
	PreFilter(context.Context, *pb.PreFilterRequest) (*pb.PreFilterReply, error)
	JudgeGroups(context.Context, *pb.JudgeGroupsRequest) (*pb.JudgeGroupsReply, error)
	FilterWhatIf(context.Context, *pb.FilterWhatIfRequest) (*pb.FilterWhatIfReply, error)
	Reserve(context.Context, *pb.ReserveRequest) (*pb.ReserveReply, error)
	ReserveBatch(context.Context, *pb.ReserveBatchRequest) (*pb.ReserveBatchReply, error)
	Unreserve(context.Context, *pb.UnreserveRequest) (*pb.UnreserveReply, error)
	Permitted(context.Context, *pb.PermittedRequest) (*pb.PermittedReply, error)
	WatchRequeue(context.Context, *pb.WatchRequeueRequest) (requeueStream, error)
}

// requeueStream yields the core's requeue batches until it fails.
type requeueStream interface {
	Recv() (*pb.RequeueBatch, error)
}

// frameClient speaks the frames to the core at one address, one call per connection at a time,
// keeping up to maxIdleConns connections between calls. Errors are gRPC statuses (status.Error),
// so callers read codes as before: the core's own status, Unavailable when nothing answered,
// DeadlineExceeded when the call's deadline passed.
type frameClient struct {
	network, address string

	mu   sync.Mutex
	idle []net.Conn
	next uint32 // the last call id handed out
}

// newFrameClient: address is unix:///path, unix:path or host:port. Nothing is dialled until a call.
func newFrameClient(address string) (*frameClient, error) {
	switch {
	case strings.HasPrefix(address, "unix://"):
		return &frameClient{network: "unix", address: strings.TrimPrefix(address, "unix://")}, nil
	case strings.HasPrefix(address, "unix:"):
		return &frameClient{network: "unix", address: strings.TrimPrefix(address, "unix:")}, nil
	}
	if _, _, err := net.SplitHostPort(address); err != nil {
		return nil, fmt.Errorf("neither unix:///path nor host:port: %w", err)
	}
	return &frameClient{network: "tcp", address: address}, nil
}

// Close drops the idle connections (calls in flight finish on theirs).
func (f *frameClient) Close() error {
	f.mu.Lock()
	idle := f.idle
	f.idle = nil
	f.mu.Unlock()
	for _, c := range idle {
		_ = c.Close()
	}
	return nil
}

func (f *frameClient) Hello(ctx context.Context, in *pb.HelloRequest) (*pb.HelloReply, error) {
	return unary(ctx, f, pb.Method_METHOD_HELLO, in, &pb.HelloReply{})
}

func (f *frameClient) PreFilter(ctx context.Context, in *pb.PreFilterRequest) (*pb.PreFilterReply, error) {
	return unary(ctx, f, pb.Method_METHOD_PRE_FILTER, in, &pb.PreFilterReply{})
}

func (f *frameClient) JudgeGroups(ctx context.Context, in *pb.JudgeGroupsRequest) (*pb.JudgeGroupsReply, error) {
	return unary(ctx, f, pb.Method_METHOD_JUDGE_GROUPS, in, &pb.JudgeGroupsReply{})
}

func (f *frameClient) FilterWhatIf(ctx context.Context, in *pb.FilterWhatIfRequest) (*pb.FilterWhatIfReply, error) {
	return unary(ctx, f, pb.Method_METHOD_FILTER_WHAT_IF, in, &pb.FilterWhatIfReply{})
}

func (f *frameClient) Reserve(ctx context.Context, in *pb.ReserveRequest) (*pb.ReserveReply, error) {
	return unary(ctx, f, pb.Method_METHOD_RESERVE, in, &pb.ReserveReply{})
}

func (f *frameClient) ReserveBatch(ctx context.Context, in *pb.ReserveBatchRequest) (*pb.ReserveBatchReply, error) {
	return unary(ctx, f, pb.Method_METHOD_RESERVE_BATCH, in, &pb.ReserveBatchReply{})
}

func (f *frameClient) Unreserve(ctx context.Context, in *pb.UnreserveRequest) (*pb.UnreserveReply, error) {
	return unary(ctx, f, pb.Method_METHOD_UNRESERVE, in, &pb.UnreserveReply{})
}

func (f *frameClient) Permitted(ctx context.Context, in *pb.PermittedRequest) (*pb.PermittedReply, error) {
	return unary(ctx, f, pb.Method_METHOD_PERMITTED, in, &pb.PermittedReply{})
}

// unary runs one call and observes it in gpusched_plugin_rpc_duration_seconds.
func unary[R proto.Message](ctx context.Context, f *frameClient, method pb.Method, in proto.Message, out R) (R, error) {
	start := time.Now()
	err := f.call(ctx, method, in, out)
	observeRPC(method, err, time.Since(start))
	if err != nil {
		var zero R
		return zero, err
	}
	return out, nil
}

// call sends the request on a pooled (or new) connection and reads its reply into out. A
// connection that failed mid-call is closed, never reused; one that carried a status back is.
func (f *frameClient) call(ctx context.Context, method pb.Method, in, out proto.Message) error {
	body, err := proto.Marshal(in)
	if err != nil {
		return status.Errorf(codes.Internal, "encoding the %s request: %v", rpcName(method), err)
	}
	conn, err := f.take(ctx)
	if err != nil {
		return err
	}
	id := f.callID()
	frame, err := roundTrip(ctx, conn, id, method, body)
	if err != nil {
		_ = conn.Close()
		return err
	}
	f.give(conn)
	if frame.kind != uint8(codes.OK) {
		return status.Error(codes.Code(frame.kind), string(frame.payload))
	}
	if err := proto.Unmarshal(frame.payload, out); err != nil {
		return status.Errorf(codes.Internal, "the core's %s reply is not protobuf: %v", rpcName(method), err)
	}
	return nil
}

func (f *frameClient) callID() uint32 {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.next++
	return f.next
}

func (f *frameClient) take(ctx context.Context) (net.Conn, error) {
	f.mu.Lock()
	if n := len(f.idle); n > 0 {
		conn := f.idle[n-1]
		f.idle = f.idle[:n-1]
		f.mu.Unlock()
		return conn, nil
	}
	f.mu.Unlock()
	var d net.Dialer
	conn, err := d.DialContext(ctx, f.network, f.address)
	if err != nil {
		return nil, wireError(ctx, fmt.Errorf("connecting: %w", err))
	}
	return conn, nil
}

func (f *frameClient) give(conn net.Conn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.idle) < maxIdleConns {
		f.idle = append(f.idle, conn)
		return
	}
	_ = conn.Close()
}

type frame struct {
	call    uint32
	kind    uint8 // a request's method, a reply's status code
	flags   uint8
	payload []byte
}

// roundTrip writes one request frame and reads the reply frame of the same call, under ctx's
// deadline (and its cancellation).
func roundTrip(ctx context.Context, conn net.Conn, id uint32, method pb.Method, body []byte) (frame, error) {
	stop := watchContext(ctx, conn)
	defer stop()
	if err := writeFrame(conn, id, uint8(method), 0, body); err != nil {
		return frame{}, wireError(ctx, err)
	}
	reply, err := readFrame(conn)
	if err != nil {
		return frame{}, wireError(ctx, err)
	}
	if reply.call != id {
		return frame{}, status.Errorf(codes.Internal, "the core answered call %d while call %d waited", reply.call, id)
	}
	return reply, nil
}

// watchContext puts ctx's deadline on conn, and interrupts conn's I/O if ctx is cancelled first;
// the returned func clears both.
func watchContext(ctx context.Context, conn net.Conn) func() {
	if d, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(d)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	return func() {
		stop()
		_ = conn.SetDeadline(time.Time{})
	}
}

func writeFrame(w io.Writer, id uint32, kind, flags uint8, body []byte) error {
	buf := make([]byte, frameHeaderBytes+len(body))
	binary.BigEndian.PutUint32(buf[0:4], uint32(len(body)))
	binary.BigEndian.PutUint32(buf[4:8], id)
	buf[8], buf[9] = kind, flags
	copy(buf[frameHeaderBytes:], body)
	_, err := w.Write(buf)
	return err
}

func readFrame(r io.Reader) (frame, error) {
	var header [frameHeaderBytes]byte
	if _, err := io.ReadFull(r, header[:]); err != nil {
		return frame{}, err
	}
	n := binary.BigEndian.Uint32(header[0:4])
	if n > maxMessageBytes {
		return frame{}, status.Errorf(codes.ResourceExhausted, "a frame of %d bytes; at most %d", n, maxMessageBytes)
	}
	payload := make([]byte, n)
	if _, err := io.ReadFull(r, payload); err != nil {
		return frame{}, err
	}
	return frame{call: binary.BigEndian.Uint32(header[4:8]), kind: header[8], flags: header[9], payload: payload}, nil
}

// wireError words an I/O failure as the status a caller reads: DeadlineExceeded when the call's
// deadline passed, Canceled when its context was, Unavailable otherwise (nothing answered).
func wireError(ctx context.Context, err error) error {
	if _, ok := status.FromError(err); ok && !errors.Is(err, os.ErrDeadlineExceeded) {
		return err
	}
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded):
		return status.Errorf(codes.DeadlineExceeded, "no answer within the deadline: %v", err)
	case errors.Is(ctx.Err(), context.Canceled):
		return status.Errorf(codes.Canceled, "the call was cancelled: %v", err)
	}
	return status.Errorf(codes.Unavailable, "%v", err)
}

// WatchRequeue opens a connection of its own for the stream; it is closed when ctx ends or the
// stream fails.
func (f *frameClient) WatchRequeue(ctx context.Context, in *pb.WatchRequeueRequest) (requeueStream, error) {
	body, err := proto.Marshal(in)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "encoding the WatchRequeue request: %v", err)
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, f.network, f.address)
	if err != nil {
		return nil, wireError(ctx, fmt.Errorf("connecting: %w", err))
	}
	id := f.callID()
	if err := writeFrame(conn, id, uint8(pb.Method_METHOD_WATCH_REQUEUE), 0, body); err != nil {
		_ = conn.Close()
		return nil, wireError(ctx, err)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	return &frameStream{ctx: ctx, conn: conn, id: id, stop: stop}, nil
}

type frameStream struct {
	ctx  context.Context
	conn net.Conn
	id   uint32
	stop func() bool
}

// Recv returns the next batch; an error (the core's status, the stream's end, a broken
// connection) closes the stream.
func (s *frameStream) Recv() (*pb.RequeueBatch, error) {
	batch, err := s.next()
	if err != nil {
		s.stop()
		_ = s.conn.Close()
	}
	return batch, err
}

func (s *frameStream) next() (*pb.RequeueBatch, error) {
	reply, err := readFrame(s.conn)
	switch {
	case err != nil:
		return nil, wireError(s.ctx, err)
	case reply.call != s.id:
		return nil, status.Errorf(codes.Internal, "the core streamed call %d on call %d's connection", reply.call, s.id)
	case reply.kind != uint8(codes.OK):
		return nil, status.Error(codes.Code(reply.kind), string(reply.payload))
	case reply.flags&frameMore == 0:
		return nil, status.Error(codes.Unavailable, "the core ended the requeue stream")
	}
	batch := &pb.RequeueBatch{}
	if err := proto.Unmarshal(reply.payload, batch); err != nil {
		return nil, status.Errorf(codes.Internal, "the core's requeue batch is not protobuf: %v", err)
	}
	return batch, nil
}
