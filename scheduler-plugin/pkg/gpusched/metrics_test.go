package gpusched

import (
	"context"
	"errors"
	"slices"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/component-base/metrics/testutil"

	pb "github.com/gpusched/gpusched/scheduler-plugin/gen/scheduling/v1"
)

const rpcMetric = "gpusched_plugin_rpc_duration_seconds"

func TestObserveRPCCountsEachCallByRPCAndCode(t *testing.T) {
	tests := []struct {
		name     string
		method   string
		err      error
		wantRPC  string
		wantCode string
	}{
		{"prefilter answered", pb.Scheduling_PreFilter_FullMethodName, nil, "PreFilter", "OK"},
		{"reserve, core gone", pb.Scheduling_Reserve_FullMethodName, status.Error(codes.Unavailable, "connection refused"), "Reserve", "Unavailable"},
		{"prefilter past its deadline", pb.Scheduling_PreFilter_FullMethodName, status.Error(codes.DeadlineExceeded, "deadline"), "PreFilter", "DeadlineExceeded"},
		{"hello, version skew", pb.Scheduling_Hello_FullMethodName, status.Error(codes.FailedPrecondition, "api 2"), "Hello", "FailedPrecondition"},
		{"unreserve, not a status", pb.Scheduling_Unreserve_FullMethodName, errors.New("io"), "Unreserve", "Unknown"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rpcDuration.Reset()
			var invoked string
			invoker := func(_ context.Context, method string, _, _ any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
				invoked = method
				return tt.err
			}
			err := observeRPC(context.Background(), tt.method, nil, nil, nil, invoker)
			if !errors.Is(err, tt.err) || invoked != tt.method {
				t.Fatalf("observeRPC returned %v after invoking %q; want the invoker's %v after %q", err, invoked, tt.err, tt.method)
			}
			// Gathered from the registry kube-scheduler's /metrics serves.
			vec, err := testutil.GetHistogramVecFromGatherer(legacyregistry.DefaultGatherer, rpcMetric,
				map[string]string{"rpc": tt.wantRPC, "code": tt.wantCode})
			if err != nil {
				t.Fatalf("%s{rpc=%q,code=%q}: %v", rpcMetric, tt.wantRPC, tt.wantCode, err)
			}
			if n := vec.GetAggregatedSampleCount(); n != 1 {
				t.Errorf("%s{rpc=%q,code=%q} counted %d calls, want 1", rpcMetric, tt.wantRPC, tt.wantCode, n)
			}
		})
	}
}

func TestRPCBucketsAreFineAroundTheTarget(t *testing.T) {
	if !slices.IsSorted(rpcBuckets) || len(slices.Compact(slices.Clone(rpcBuckets))) != len(rpcBuckets) {
		t.Fatalf("bucket bounds not strictly increasing: %v", rpcBuckets)
	}
	tests := []struct {
		name  string
		bound float64
	}{
		{"first step, 0.1 ms", 0.0001},
		{"the PreFilter p99 target, 2 ms", 0.002},
		{"end of the fine range, 5 ms", 0.005},
		{"coarse, 10 ms", 0.01},
		{"past the default 5 s deadline", 5.12},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !slices.Contains(rpcBuckets, tt.bound) {
				t.Errorf("no bucket bound at %g s: %v", tt.bound, rpcBuckets)
			}
		})
	}
}
