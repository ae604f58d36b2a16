package gpusched

import (
	"errors"
	"slices"
	"testing"
	"time"

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
		method   pb.Method
		err      error
		wantRPC  string
		wantCode string
	}{
		{"prefilter answered", pb.Method_METHOD_PRE_FILTER, nil, "PreFilter", "OK"},
		{"reserve, core gone", pb.Method_METHOD_RESERVE, status.Error(codes.Unavailable, "connection refused"), "Reserve", "Unavailable"},
		{"prefilter past its deadline", pb.Method_METHOD_PRE_FILTER, status.Error(codes.DeadlineExceeded, "deadline"), "PreFilter", "DeadlineExceeded"},
		{"hello, version skew", pb.Method_METHOD_HELLO, status.Error(codes.FailedPrecondition, "api 2"), "Hello", "FailedPrecondition"},
		{"unreserve, not a status", pb.Method_METHOD_UNRESERVE, errors.New("io"), "Unreserve", "Unknown"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rpcDuration.Reset()
			observeRPC(tt.method, tt.err, 300*time.Microsecond)
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
