package gpusched

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	pb "github.com/gpusched/gpusched/scheduler-plugin/gen/scheduling/v1"
)

// fakeCore is an in-process gpusched core: it answers what the test sets and records requests.
type fakeCore struct {
	pb.UnimplementedSchedulingServer
	mu          sync.Mutex
	preFilter   func(*pb.PreFilterRequest) (*pb.PreFilterReply, error)
	reserve     func(*pb.ReserveRequest) (*pb.ReserveReply, error)
	permitted   func(*pb.PermittedRequest) (*pb.PermittedReply, error)
	generations []uint64 // table_generation of each PreFilter request
	unreserved  []string // node of each Unreserve
	reasons     []string // reason of each Unreserve
	keepHolds   []bool   // keep_hold of each Unreserve
}

func (f *fakeCore) PreFilter(_ context.Context, r *pb.PreFilterRequest) (*pb.PreFilterReply, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.generations = append(f.generations, r.GetTableGeneration())
	return f.preFilter(r)
}

func (f *fakeCore) Reserve(_ context.Context, r *pb.ReserveRequest) (*pb.ReserveReply, error) {
	return f.reserve(r)
}

func (f *fakeCore) Unreserve(_ context.Context, r *pb.UnreserveRequest) (*pb.UnreserveReply, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.unreserved = append(f.unreserved, r.GetNode())
	f.reasons = append(f.reasons, r.GetReason())
	f.keepHolds = append(f.keepHolds, r.GetKeepHold())
	return &pb.UnreserveReply{}, nil
}

func (f *fakeCore) Permitted(_ context.Context, r *pb.PermittedRequest) (*pb.PermittedReply, error) {
	return f.permitted(r)
}

// fakeHandle is the framework handle as far as GpuSched uses it: ClientSet for Bind, the
// waiting pods for Permit and Unreserve (a test adds a pod there when Permit answered Wait, as
// the framework does).
type fakeHandle struct {
	fwk.Handle
	cs      kubernetes.Interface
	waiting *waitingPods
}

func (h fakeHandle) ClientSet() kubernetes.Interface { return h.cs }

func (h fakeHandle) GetWaitingPod(uid types.UID) fwk.WaitingPod {
	if wp := h.waiting.get(uid); wp != nil {
		return wp
	}
	return nil // an untyped nil, as the framework returns for a pod not waiting
}

func (h fakeHandle) RejectWaitingPod(uid types.UID) bool {
	if wp := h.waiting.get(uid); wp != nil {
		return wp.Reject(Name, "rejected")
	}
	return false
}

// waitingPods is the framework's waiting-pod map as the tests see it: what each pod was told.
type waitingPods struct {
	mu   sync.Mutex
	pods map[types.UID]*fakeWaitingPod
}

func (w *waitingPods) park(pod *v1.Pod) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.pods[pod.UID] = &fakeWaitingPod{pod: pod}
}

func (w *waitingPods) get(uid types.UID) *fakeWaitingPod {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pods[uid]
}

// outcome is "allowed", "rejected" or "" (still waiting) for a parked pod.
func (w *waitingPods) outcome(uid types.UID) string {
	wp := w.get(uid)
	if wp == nil {
		return "not parked"
	}
	wp.mu.Lock()
	defer wp.mu.Unlock()
	return wp.outcome
}

type fakeWaitingPod struct {
	fwk.WaitingPod
	pod     *v1.Pod
	mu      sync.Mutex
	outcome string
}

func (wp *fakeWaitingPod) GetPod() *v1.Pod { return wp.pod }

func (wp *fakeWaitingPod) Allow(string) { wp.decide("allowed") }

func (wp *fakeWaitingPod) Reject(string, string) bool { return wp.decide("rejected") }

func (wp *fakeWaitingPod) decide(outcome string) bool {
	wp.mu.Lock()
	defer wp.mu.Unlock()
	if wp.outcome != "" {
		return false
	}
	wp.outcome = outcome
	return true
}

// start serves f (a fakeCore, or one embedding it) in frames (serveFrames) and returns a plugin talking to it
// (its answer cache off: every PreFilter asks), and the fake clientset.
func start(t *testing.T, f pb.SchedulingServer, timeout time.Duration, objects ...runtime.Object) (*Plugin, *fake.Clientset) {
	t.Helper()
	return startWith(t, f, timeout, 0, objects...)
}

// startWith is start with the answer cache's age (see answerCache).
func startWith(t *testing.T, f pb.SchedulingServer, timeout, answerMaxAge time.Duration, objects ...runtime.Object) (*Plugin, *fake.Clientset) {
	t.Helper()
	return startAudited(t, f, timeout, answerMaxAge, false, objects...)
}

// startAudited is startWith with args.answerAudit.
func startAudited(t *testing.T, f pb.SchedulingServer, timeout, answerMaxAge time.Duration, answerAudit bool,
	objects ...runtime.Object) (*Plugin, *fake.Clientset) {
	t.Helper()
	return startLingering(t, f, timeout, answerMaxAge, 0, answerAudit, objects...)
}

// startLingering is startAudited with args.confirmLinger (0 elsewhere: each confirmation sent at once).
func startLingering(t *testing.T, f pb.SchedulingServer, timeout, answerMaxAge, linger time.Duration, answerAudit bool,
	objects ...runtime.Object) (*Plugin, *fake.Clientset) {
	t.Helper()
	address, _ := serveFrames(t, f)
	conn, err := newFrameClient(address)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	cs := fake.NewClientset(objects...)
	handle := fakeHandle{cs: cs, waiting: &waitingPods{pods: map[types.UID]*fakeWaitingPod{}}}
	return newPlugin(handle, newCore("unix:///fake/scheduling.sock", timeout, answerMaxAge, linger, answerAudit, conn),
		DefaultNarrowFromNodes), cs
}

func makePod(name string) *v1.Pod {
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name)}}
}

func nodeInfo(name string) fwk.NodeInfo {
	ni := framework.NewNodeInfo()
	ni.SetNode(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
	return ni
}

// vectors answers for the table (gen, names): verdict, reason and score per node.
func vectors(gen uint64, names []string, withTable bool, verdicts []pb.Verdict, reasons []string, scores []byte) *pb.PreFilterReply {
	reply := &pb.PreFilterReply{TableGeneration: gen, Reasons: []string{""}, Scores: scores}
	if withTable {
		reply.Table = &pb.NodeTable{Generation: gen, Names: names}
	}
	for i, v := range verdicts {
		reply.Verdicts = append(reply.Verdicts, byte(v))
		idx := 0
		if reasons[i] != "" {
			idx = len(reply.Reasons)
			reply.Reasons = append(reply.Reasons, reasons[i])
		}
		reply.ReasonIndex = append(reply.ReasonIndex, uint32(idx))
	}
	return reply
}

func TestVerdictsToStatuses(t *testing.T) {
	names := []string{"gpu-a", "gpu-b", "gpu-c"}
	f := &fakeCore{preFilter: func(r *pb.PreFilterRequest) (*pb.PreFilterReply, error) {
		return vectors(7, names, r.GetTableGeneration() != 7,
			[]pb.Verdict{pb.Verdict_VERDICT_FITS, pb.Verdict_VERDICT_NOT_NOW, pb.Verdict_VERDICT_NEVER},
			[]string{"", "2 GPUs free, 4 asked", "model needs 80 GiB per GPU, node has 24"}, []byte{90, 0, 0}), nil
	}}
	p, _ := start(t, f, time.Second)
	state := framework.NewCycleState()
	if _, st := p.PreFilter(context.Background(), state, makePod("p"), nil); !st.IsSuccess() {
		t.Fatalf("PreFilter: %v", st)
	}
	for _, tc := range []struct {
		node   string
		code   fwk.Code
		reason string
		score  int64
	}{
		{"gpu-a", fwk.Success, "", 90},
		{"gpu-b", fwk.Unschedulable, "2 GPUs free, 4 asked", 0},
		{"gpu-c", fwk.UnschedulableAndUnresolvable, "model needs 80 GiB per GPU, node has 24", 0},
		{"cpu-new", fwk.Unschedulable, "gpusched has not seen node cpu-new yet", 0},
	} {
		t.Run(tc.node, func(t *testing.T) {
			st := p.Filter(context.Background(), state, makePod("p"), nodeInfo(tc.node))
			if st.Code() != tc.code || st.Message() != tc.reason {
				t.Errorf("Filter(%s) = %v %q, want %v %q", tc.node, st.Code(), st.Message(), tc.code, tc.reason)
			}
			if tc.code == fwk.Success {
				score, st := p.Score(context.Background(), state, makePod("p"), nodeInfo(tc.node))
				if !st.IsSuccess() || score != tc.score {
					t.Errorf("Score(%s) = %d %v, want %d", tc.node, score, st, tc.score)
				}
			}
		})
	}
	if st := p.PreScore(context.Background(), state, makePod("p"), nil); !st.IsSuccess() {
		t.Errorf("PreScore of a GPU pod: %v, want Success", st)
	}
}

func TestTableUpdates(t *testing.T) {
	// Each step: what the core's table is when asked, and the generation the plugin must send.
	type step struct {
		gen      uint64
		names    []string
		wantSent []uint64 // table_generation of the request(s) of this PreFilter
		staleAck bool     // the core answers without a table for a generation the plugin lacks
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"first answer carries the table, later ones do not", []step{
			{gen: 1, names: []string{"a", "b"}, wantSent: []uint64{0}},
			{gen: 1, names: []string{"a", "b"}, wantSent: []uint64{1}},
		}},
		{"a new generation replaces the table", []step{
			{gen: 1, names: []string{"a", "b"}, wantSent: []uint64{0}},
			{gen: 2, names: []string{"b", "c", "a"}, wantSent: []uint64{1}},
			{gen: 2, names: []string{"b", "c", "a"}, wantSent: []uint64{2}},
		}},
		{"an answer for a table the plugin lacks is asked again naming none", []step{
			{gen: 1, names: []string{"a"}, wantSent: []uint64{0}},
			{gen: 5, names: []string{"c", "a"}, wantSent: []uint64{1, 0}, staleAck: true},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var cur step
			f := &fakeCore{preFilter: func(r *pb.PreFilterRequest) (*pb.PreFilterReply, error) {
				n := len(cur.names)
				verdicts := make([]pb.Verdict, n)
				scores := make([]byte, n)
				for i := range scores {
					scores[i] = byte(10 * (i + 1)) // node i scores 10(i+1)
				}
				send := r.GetTableGeneration() != cur.gen && !(cur.staleAck && r.GetTableGeneration() != 0)
				return vectors(cur.gen, cur.names, send, verdicts, make([]string, n), scores), nil
			}}
			p, _ := start(t, f, time.Second)
			for i, s := range tc.steps {
				cur = s
				f.generations = nil
				state := framework.NewCycleState()
				if _, st := p.PreFilter(context.Background(), state, makePod("p"), nil); !st.IsSuccess() {
					t.Fatalf("step %d: PreFilter: %v", i, st)
				}
				if got := f.generations; !equal(got, s.wantSent) {
					t.Errorf("step %d: sent table generations %v, want %v", i, got, s.wantSent)
				}
				for j, name := range s.names {
					score, st := p.Score(context.Background(), state, makePod("p"), nodeInfo(name))
					if !st.IsSuccess() || score != int64(10*(j+1)) {
						t.Errorf("step %d: Score(%s) = %d %v, want %d", i, name, score, st, 10*(j+1))
					}
				}
				if held := p.core.heldTable(); held.generation != s.gen || len(held.index) != len(s.names) {
					t.Errorf("step %d: holds table %d of %d names, want %d of %d", i, held.generation, len(held.index), s.gen, len(s.names))
				}
			}
		})
	}
}

func equal(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestPreFilterOutcomes(t *testing.T) {
	for _, tc := range []struct {
		name     string
		answer   func(*pb.PreFilterRequest) (*pb.PreFilterReply, error)
		code     fwk.Code
		contains string
	}{
		{"skip", func(*pb.PreFilterRequest) (*pb.PreFilterReply, error) { return &pb.PreFilterReply{Skip: true}, nil },
			fwk.Skip, ""},
		{"core error", func(*pb.PreFilterRequest) (*pb.PreFilterReply, error) {
			return &pb.PreFilterReply{Error: "gpusched is not ready: ledger rebuilding"}, nil
		}, fwk.Error, "gpusched is not ready: ledger rebuilding; the pod is retried"},
		{"unresolvable", func(*pb.PreFilterRequest) (*pb.PreFilterReply, error) {
			return &pb.PreFilterReply{Unresolvable: "TP=3 does not divide 64 heads"}, nil
		}, fwk.UnschedulableAndUnresolvable, "TP=3 does not divide 64 heads"},
		{"version skew", func(*pb.PreFilterRequest) (*pb.PreFilterReply, error) {
			return nil, status.Error(codes.FailedPrecondition, "the GpuSched plugin speaks v1, this core speaks v2")
		}, fwk.Error, "gpusched core at unix:///fake/scheduling.sock refused this plugin: the GpuSched plugin speaks v1, this core speaks v2"},
		{"core down", func(*pb.PreFilterRequest) (*pb.PreFilterReply, error) {
			return nil, status.Error(codes.Unavailable, "connection refused")
		}, fwk.Error, "gpusched core unreachable at unix:///fake/scheduling.sock: Unavailable: connection refused; the pod waits and is retried"},
		{"deadline", func(*pb.PreFilterRequest) (*pb.PreFilterReply, error) {
			time.Sleep(time.Second) // past the plugin's 200 ms deadline
			return nil, errors.New("answered too late")
		}, fwk.Error, "gpusched core unreachable at unix:///fake/scheduling.sock: DeadlineExceeded"},
		{"vectors not of the table's length", func(*pb.PreFilterRequest) (*pb.PreFilterReply, error) {
			return &pb.PreFilterReply{TableGeneration: 1, Table: &pb.NodeTable{Generation: 1, Names: []string{"a", "b"}},
				Verdicts: []byte{0}, Scores: []byte{0, 0}, ReasonIndex: []uint32{0, 0}}, nil
		}, fwk.Error, "answered 1 verdicts, 2 scores, 2 reason indices for a table of 2 nodes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := start(t, &fakeCore{preFilter: tc.answer}, 200*time.Millisecond)
			state := framework.NewCycleState()
			_, st := p.PreFilter(context.Background(), state, makePod("p"), nil)
			if st.Code() != tc.code || !strings.Contains(st.Message(), tc.contains) {
				t.Fatalf("PreFilter = %v %q, want %v containing %q", st.Code(), st.Message(), tc.code, tc.contains)
			}
			if tc.code == fwk.Skip {
				if st := p.PreScore(context.Background(), state, makePod("p"), nil); !st.IsSkip() {
					t.Errorf("PreScore after a skip = %v, want Skip", st)
				}
				if st := p.Reserve(context.Background(), state, makePod("p"), "a"); !st.IsSuccess() {
					t.Errorf("Reserve after a skip = %v, want Success", st)
				}
			}
		})
	}
}

// bindings records the Bindings created through cs (the fake clientset does not apply them).
type bindings struct {
	mu   sync.Mutex
	made map[string]*v1.Binding // by pod name
}

func recordBindings(cs *fake.Clientset) *bindings {
	b := &bindings{made: map[string]*v1.Binding{}}
	cs.PrependReactor("create", "pods", func(action k8stesting.Action) (bool, runtime.Object, error) {
		create, ok := action.(k8stesting.CreateAction)
		if !ok || action.GetSubresource() != "binding" {
			return false, nil, nil
		}
		binding := create.GetObject().(*v1.Binding)
		b.mu.Lock()
		defer b.mu.Unlock()
		b.made[binding.Name] = binding
		return true, binding, nil
	})
	return b
}

func (b *bindings) of(pod string) *v1.Binding {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.made[pod]
}

func TestReserveAndBind(t *testing.T) {
	annotations := map[string]string{"gpusched.io/assigned-gpus": "GPU-0,GPU-1", "gpusched.io/assigned-gpu-indices": "0,1",
		"gpusched.io/decision-id": "d-42"}
	for _, tc := range []struct {
		name    string
		reply   *pb.ReserveReply
		err     error
		code    fwk.Code
		message string
	}{
		{"reserved", &pb.ReserveReply{Reserved: true, Annotations: annotations, Summary: "GPUs [0,1] on a"}, nil, fwk.Success, ""},
		{"refused", &pb.ReserveReply{Refusal: "GPUs 0,1 on a were taken since PreFilter"}, nil, fwk.Unschedulable,
			"GPUs 0,1 on a were taken since PreFilter"},
		{"core down", nil, status.Error(codes.Unavailable, "gone"), fwk.Error,
			"gpusched core unreachable at unix:///fake/scheduling.sock: Unavailable: gone; the pod waits and is retried"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeCore{
				preFilter: func(r *pb.PreFilterRequest) (*pb.PreFilterReply, error) {
					return vectors(1, []string{"a"}, true, []pb.Verdict{pb.Verdict_VERDICT_FITS}, []string{""}, []byte{50}), nil
				},
				reserve: func(r *pb.ReserveRequest) (*pb.ReserveReply, error) {
					if r.GetNode() != "a" || r.GetPod().GetName() != "p" || !strings.Contains(string(r.GetPod().GetJson()), `"name":"p"`) {
						return nil, status.Errorf(codes.InvalidArgument, "unexpected request %v", r)
					}
					return tc.reply, tc.err
				},
			}
			pod := makePod("p")
			p, cs := start(t, f, time.Second, pod)
			state := framework.NewCycleState()
			if _, st := p.PreFilter(context.Background(), state, pod, nil); !st.IsSuccess() {
				t.Fatalf("PreFilter: %v", st)
			}
			st := p.Reserve(context.Background(), state, pod, "a")
			if st.Code() != tc.code || st.Message() != tc.message {
				t.Fatalf("Reserve = %v %q, want %v %q", st.Code(), st.Message(), tc.code, tc.message)
			}
			made := recordBindings(cs)
			if tc.code != fwk.Success {
				if st := p.Bind(context.Background(), state, pod, "a"); !st.IsSkip() {
					t.Errorf("Bind without a reservation = %v, want Skip (the default binder binds)", st)
				}
				p.Unreserve(context.Background(), state, pod, "a")
				if len(f.unreserved) != 1 || f.unreserved[0] != "a" {
					t.Errorf("Unreserve reached the core as %v, want [a]", f.unreserved)
				}
				return
			}
			if st := p.Bind(context.Background(), state, pod, "a"); !st.IsSuccess() {
				t.Fatalf("Bind: %v", st)
			}
			binding := made.of("p")
			if binding == nil || binding.Target.Name != "a" || binding.UID != pod.UID {
				t.Fatalf("Binding %+v, want one of pod p (its UID) to node a", binding)
			}
			for k, v := range annotations {
				if binding.Annotations[k] != v {
					t.Errorf("Binding annotation %s = %q, want %q", k, binding.Annotations[k], v)
				}
			}
		})
	}
}

// A Binding whose write may have landed (no answer said it did not), or a reservation that re-chose
// the pod's own earlier hold, must not free the GPUs at Unreserve: the pod may run on them, and
// the next pod would be promised them (tests/e2e/test_faults.py restarts the apiserver mid-burst).
func TestUnreserveAfterAFailedBindKeepsTheHoldWhereTheWriteMayHaveLanded(t *testing.T) {
	pods := schema.GroupResource{Resource: "pods"}
	for _, tc := range []struct {
		name      string
		bindErr   error
		keptEarly bool
		keep      bool
	}{
		{"connection lost", errors.New("http2: client connection lost"), false, true},
		{"apiserver 500", apierrors.NewInternalError(errors.New("etcd leader changed")), false, true},
		{"apiserver timeout", apierrors.NewServerTimeout(pods, "create", 1), false, true},
		{"already assigned", apierrors.NewConflict(pods, "p", errors.New("pod p is already assigned to node \"a\"")), false, true},
		{"another conflict", apierrors.NewConflict(pods, "p", errors.New("the object has been modified")), false, false},
		{"forbidden", apierrors.NewForbidden(pods, "p", errors.New("RBAC: not allowed")), false, false},
		{"forbidden, earlier hold kept", apierrors.NewForbidden(pods, "p", errors.New("RBAC: not allowed")), true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeCore{
				preFilter: func(*pb.PreFilterRequest) (*pb.PreFilterReply, error) {
					return vectors(1, []string{"a"}, true, []pb.Verdict{pb.Verdict_VERDICT_FITS}, []string{""}, []byte{50}), nil
				},
				reserve: func(*pb.ReserveRequest) (*pb.ReserveReply, error) {
					return &pb.ReserveReply{Reserved: true, Annotations: map[string]string{"gpusched.io/decision-id": "d"},
						KeepsEarlierHold: tc.keptEarly}, nil
				},
			}
			pod := makePod("p")
			p, cs := start(t, f, time.Second, pod)
			cs.PrependReactor("create", "pods", func(action k8stesting.Action) (bool, runtime.Object, error) {
				return action.GetSubresource() == "binding", nil, tc.bindErr
			})
			state := framework.NewCycleState()
			if _, st := p.PreFilter(context.Background(), state, pod, nil); !st.IsSuccess() {
				t.Fatalf("PreFilter: %v", st)
			}
			if st := p.Reserve(context.Background(), state, pod, "a"); !st.IsSuccess() {
				t.Fatalf("Reserve: %v", st)
			}
			if st := p.Bind(context.Background(), state, pod, "a"); st.IsSuccess() {
				t.Fatalf("Bind succeeded; the test's reactor fails it with %v", tc.bindErr)
			}
			p.Unreserve(context.Background(), state, pod, "a")
			f.mu.Lock()
			defer f.mu.Unlock()
			if len(f.keepHolds) != 1 || f.keepHolds[0] != tc.keep {
				t.Fatalf("Unreserve reached the core with keep_hold %v, want [%v]", f.keepHolds, tc.keep)
			}
		})
	}
}

func TestBindOfAPodGpuschedNeverJudgedIsTheDefaultBinders(t *testing.T) {
	p, _ := start(t, &fakeCore{}, time.Second)
	if st := p.Bind(context.Background(), framework.NewCycleState(), makePod("web"), "a"); !st.IsSkip() {
		t.Fatalf("Bind = %v, want Skip", st)
	}
}

// kube-scheduler 1.37's pod-group cycle (GenericWorkload) reserves each member tentatively and
// unreserves them all once the group's algorithm is done, under that algorithm's context, which it
// has canceled by then: the release must still reach the core, or the GPUs stay held and refuse
// the same pod's Reserve in the binding cycle that follows.
func TestUnreserveReachesTheCoreUnderACanceledCycleContext(t *testing.T) {
	f := &fakeCore{
		preFilter: func(*pb.PreFilterRequest) (*pb.PreFilterReply, error) {
			return vectors(1, []string{"a"}, true, []pb.Verdict{pb.Verdict_VERDICT_FITS}, []string{""}, []byte{50}), nil
		},
		reserve: func(*pb.ReserveRequest) (*pb.ReserveReply, error) {
			return &pb.ReserveReply{Reserved: true, Annotations: map[string]string{"gpusched.io/decision-id": "d"}}, nil
		},
	}
	pod := makePod("p")
	p, _ := start(t, f, time.Second, pod)
	cycle, cancel := context.WithCancel(context.Background())
	state := framework.NewCycleState()
	if _, st := p.PreFilter(cycle, state, pod, nil); !st.IsSuccess() {
		t.Fatalf("PreFilter: %v", st)
	}
	if st := p.Reserve(cycle, state, pod, "a"); !st.IsSuccess() {
		t.Fatalf("Reserve: %v", st)
	}
	cancel()
	p.Unreserve(cycle, state, pod, "a")
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.unreserved) != 1 || f.unreserved[0] != "a" {
		t.Fatalf("Unreserve under a canceled context reached the core as %v, want [a]", f.unreserved)
	}
}

// gangCore answers for one gang "ns/g" planned on node a: members reserve in order, the one that
// completes the group gets an open barrier, Permitted gives each member its commit annotations.
func gangCore(members int) *fakeCore {
	reserved := 0
	f := &fakeCore{
		preFilter: func(*pb.PreFilterRequest) (*pb.PreFilterReply, error) {
			reply := vectors(1, []string{"a", "b"}, true, []pb.Verdict{pb.Verdict_VERDICT_FITS, pb.Verdict_VERDICT_NOT_NOW},
				[]string{"", "gang ns/g: this member is reserved GPUs on node a"}, []byte{50, 0})
			reply.OnlyNodes = []string{"a"}
			return reply, nil
		},
		permitted: func(r *pb.PermittedRequest) (*pb.PermittedReply, error) {
			return &pb.PermittedReply{Permitted: true, Annotations: map[string]string{
				"gpusched.io/assigned-gpus": "GPU-" + r.GetPod().GetName(), "gpusched.io/gang-commit": "ns/g@1"}}, nil
		},
	}
	f.reserve = func(*pb.ReserveRequest) (*pb.ReserveReply, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		reserved++
		return &pb.ReserveReply{Reserved: true, Annotations: map[string]string{"gpusched.io/decision-id": "d"},
			Barrier: &pb.Barrier{Gang: "ns/g", Open: reserved == members, WaitSeconds: 30}}, nil
	}
	return f
}

// member runs PreFilter, Reserve and Permit for one gang member and parks it if told to wait.
func member(t *testing.T, p *Plugin, pod *v1.Pod) (fwk.CycleState, *fwk.Status, time.Duration) {
	t.Helper()
	state := framework.NewCycleState()
	result, st := p.PreFilter(context.Background(), state, pod, nil)
	if !st.IsSuccess() || result.AllNodes() || !result.NodeNames.Has("a") || result.NodeNames.Len() != 1 {
		t.Fatalf("PreFilter(%s) = %v, %v; want Success with PreFilterResult {a}", pod.Name, result, st)
	}
	if st := p.Reserve(context.Background(), state, pod, "a"); !st.IsSuccess() {
		t.Fatalf("Reserve(%s): %v", pod.Name, st)
	}
	st, wait := p.Permit(context.Background(), state, pod, "a")
	if st.Code() == fwk.Wait {
		p.handle.(fakeHandle).waiting.park(pod)
	}
	return state, st, wait
}

func TestGangBarrierAllowsTheWholeGroupAtOnce(t *testing.T) {
	pods := []*v1.Pod{makePod("g-0"), makePod("g-1"), makePod("g-2")}
	p, cs := start(t, gangCore(3), time.Second, pods[0], pods[1], pods[2])
	waiting := p.handle.(fakeHandle).waiting
	states := make([]fwk.CycleState, 3)
	for i, pod := range pods[:2] {
		state, st, wait := member(t, p, pod)
		if st.Code() != fwk.Wait || wait != 30*time.Second {
			t.Fatalf("Permit(%s) = %v %v, want Wait 30s", pod.Name, st, wait)
		}
		states[i] = state
	}
	if got := waiting.outcome(pods[0].UID) + waiting.outcome(pods[1].UID); got != "" {
		t.Fatalf("before the group is complete, waiting members were told %q", got)
	}
	state, st, wait := member(t, p, pods[2])
	if !st.IsSuccess() || wait != 0 {
		t.Fatalf("Permit of the completing member = %v %v, want Success", st, wait)
	}
	states[2] = state
	for _, pod := range pods[:2] {
		if got := waiting.outcome(pod.UID); got != "allowed" {
			t.Errorf("%s at Permit: %q, want allowed", pod.Name, got)
		}
	}
	made := recordBindings(cs)
	for i, pod := range pods {
		if st := p.Bind(context.Background(), states[i], pod, "a"); !st.IsSuccess() {
			t.Fatalf("Bind(%s): %v", pod.Name, st)
		}
		got := made.of(pod.Name)
		if got == nil || got.Annotations["gpusched.io/gang-commit"] != "ns/g@1" || got.Annotations["gpusched.io/assigned-gpus"] != "GPU-"+pod.Name {
			t.Errorf("%s's Binding %+v, want the Permitted annotations", pod.Name, got)
		}
	}
}

func TestGangMemberUnreservedRejectsItsWaitingSiblings(t *testing.T) {
	pods := []*v1.Pod{makePod("g-0"), makePod("g-1"), makePod("other")}
	f := gangCore(3)
	p, _ := start(t, f, time.Second)
	waiting := p.handle.(fakeHandle).waiting
	var states []fwk.CycleState
	for _, pod := range pods[:2] {
		state, st, _ := member(t, p, pod)
		if st.Code() != fwk.Wait {
			t.Fatalf("Permit(%s) = %v, want Wait", pod.Name, st)
		}
		states = append(states, state)
	}
	p.waiting.add(pods[2].UID, "ns/another-gang")
	waiting.park(pods[2])

	// g-0's Permit timed out: the framework rejected it and calls Unreserve.
	p.Unreserve(context.Background(), states[0], pods[0], "a")
	if got := waiting.outcome(pods[1].UID); got != "rejected" {
		t.Errorf("sibling g-1 at Permit: %q, want rejected", got)
	}
	if got := waiting.outcome(pods[2].UID); got != "" {
		t.Errorf("another gang's member: %q, want still waiting", got)
	}
	if len(f.reasons) != 1 || !strings.Contains(f.reasons[0], "gang ns/g") {
		t.Errorf("Unreserve reached the core with reasons %q, want one naming gang ns/g", f.reasons)
	}
	if uids := p.waiting.members("ns/g"); len(uids) != 1 || uids[0] != pods[1].UID {
		t.Errorf("waiting members of ns/g after g-0's Unreserve: %v, want [g-1] until its own Unreserve", uids)
	}
}

func TestPermitOfAMemberPastItsDeadlineIsUnschedulable(t *testing.T) {
	f := gangCore(3)
	f.reserve = func(*pb.ReserveRequest) (*pb.ReserveReply, error) {
		return &pb.ReserveReply{Reserved: true, Barrier: &pb.Barrier{Gang: "ns/g", WaitSeconds: 0}}, nil
	}
	p, _ := start(t, f, time.Second)
	_, st, _ := member(t, p, makePod("g-0"))
	if st.Code() != fwk.Unschedulable || !strings.Contains(st.Message(), "deadline passed") {
		t.Fatalf("Permit = %v, want Unschedulable naming the deadline", st)
	}
}

func TestDecodeArgs(t *testing.T) {
	for _, tc := range []struct {
		name    string
		obj     runtime.Object
		address string
		timeout time.Duration
		err     string
	}{
		{"json", &runtime.Unknown{Raw: []byte(`{"address":"unix:///run/gpusched/scheduling.sock","timeout":"2s"}`),
			ContentType: runtime.ContentTypeJSON}, "unix:///run/gpusched/scheduling.sock", 2 * time.Second, ""},
		{"default timeout", &runtime.Unknown{Raw: []byte(`{"address":"127.0.0.1:9000"}`)}, "127.0.0.1:9000", DefaultTimeout, ""},
		{"typed", &Args{Address: "unix:///s.sock"}, "unix:///s.sock", DefaultTimeout, ""},
		{"no args", nil, "", 0, "pluginConfig[GpuSched].args.address: required"},
		{"no socket path", &runtime.Unknown{Raw: []byte(`{"address":"unix://"}`)}, "", 0, `names no socket path`},
		{"bad timeout", &runtime.Unknown{Raw: []byte(`{"address":"unix:///s","timeout":"-1s"}`)}, "", 0,
			"pluginConfig[GpuSched].args.timeout: must be > 0, got -1s"},
		{"not json", &runtime.Unknown{Raw: []byte(`{`)}, "", 0, "pluginConfig[GpuSched].args: "},
		{"negative linger", &runtime.Unknown{Raw: []byte(`{"address":"unix:///s","confirmLinger":"-1ms"}`)}, "", 0,
			"pluginConfig[GpuSched].args.confirmLinger: must be between 0s (send at once) and 1s"},
		{"linger past a second", &runtime.Unknown{Raw: []byte(`{"address":"unix:///s","confirmLinger":"2s"}`)}, "", 0,
			"each pod's Bind waits this long at most), got 2s"},
		{"negative narrowFromNodes", &runtime.Unknown{Raw: []byte(`{"address":"unix:///s","narrowFromNodes":-1}`)}, "", 0,
			"pluginConfig[GpuSched].args.narrowFromNodes: must be >= 0 (0: at every size), got -1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args, err := decodeArgs(tc.obj)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil || args.Address != tc.address || args.Timeout.Duration != tc.timeout ||
				args.ConfirmLinger.Duration != DefaultConfirmLinger || *args.NarrowFromNodes != DefaultNarrowFromNodes {
				t.Fatalf("= %+v %v, want %s %s (linger %s)", args, err, tc.address, tc.timeout, DefaultConfirmLinger)
			}
		})
	}
}

func TestBindOfAGangMemberWithoutPermitNamesTheMissingExtensionPoint(t *testing.T) {
	pod := makePod("g-0")
	p, cs := start(t, gangCore(2), time.Second, pod)
	made := recordBindings(cs)
	state := framework.NewCycleState()
	if _, st := p.PreFilter(context.Background(), state, pod, nil); !st.IsSuccess() {
		t.Fatalf("PreFilter: %v", st)
	}
	if st := p.Reserve(context.Background(), state, pod, "a"); !st.IsSuccess() {
		t.Fatalf("Reserve: %v", st)
	}
	// A profile without GpuSched at permit: the framework goes from Reserve straight to binding.
	st := p.Bind(context.Background(), state, pod, "a")
	if st.Code() != fwk.Error || !strings.Contains(st.Message(), "enable GpuSched at the permit extension point") {
		t.Fatalf("Bind = %v %q, want an Error naming the permit extension point", st.Code(), st.Message())
	}
	if made.of("g-0") != nil {
		t.Fatal("a gang member was bound without passing Permit")
	}
}

func TestTheCoreGetsThePodWithoutItsManagedFields(t *testing.T) {
	pod := makePod("p")
	pod.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply}}
	pod.Labels = map[string]string{"app": "vllm"}
	pod.Status.NominatedNodeName = "n1"
	wire, err := wirePod(pod)
	if err != nil {
		t.Fatal(err)
	}
	var got v1.Pod
	if err := json.Unmarshal(wire.GetJson(), &got); err != nil {
		t.Fatal(err)
	}
	if got.ManagedFields != nil || got.Labels["app"] != "vllm" || got.Status.NominatedNodeName != "n1" || got.UID != pod.UID {
		t.Fatalf("the core got %+v", got)
	}
	if len(pod.ManagedFields) != 1 {
		t.Fatal("wirePod changed the informer's pod")
	}
}

func TestPodsOfOneSpecSignAlikeAndAnyOtherSpecOtherwise(t *testing.T) {
	p := newPlugin(fakeHandle{}, nil, DefaultNarrowFromNodes)
	sign := func(pod *v1.Pod) string {
		fragments, st := p.SignPod(context.Background(), pod)
		if !st.IsSuccess() || len(fragments) != 1 || fragments[0].Key != SpecSignerName {
			t.Fatalf("SignPod(%s) = %v, %v", pod.Name, fragments, st)
		}
		value, ok := fragments[0].Value.(string)
		if !ok || !utf8.ValidString(value) { // kube-scheduler JSON-encodes the signature
			t.Fatalf("SignPod(%s) fragment %#v is not a valid UTF-8 string", pod.Name, fragments[0].Value)
		}
		return value
	}
	base := makePod("p-1")
	replica := makePod("p-2")
	replica.UID = "another-uid"
	if sign(base) != sign(replica) {
		t.Fatal("two replicas of one spec signed differently: kube-scheduler would never batch them")
	}
	for name, change := range map[string]func(*v1.Pod){
		"namespace":  func(p *v1.Pod) { p.Namespace = "other" },
		"label":      func(p *v1.Pod) { p.Labels = map[string]string{"gpusched.io/gang-name": "g"} },
		"annotation": func(p *v1.Pod) { p.Annotations = map[string]string{"gpusched.io/tensor-parallel-size": "2"} },
		"spec":       func(p *v1.Pod) { p.Spec.PriorityClassName = "high" },
	} {
		other := makePod("p-3")
		change(other)
		if sign(other) == sign(base) {
			t.Errorf("a pod with another %s signed as the first: one would be batched on the other's ranking", name)
		}
	}
}

// A pod asking for no GPU that the core scores (issue 44: FragmentationScore judges the CPU such
// pods take): Filter is skipped, Score reads the core's scores, and nothing is reserved, unreserved
// or bound by gpusched (the default binder binds it).
func TestAScoreOnlyAnswerIsScoredAndNeverReserved(t *testing.T) {
	names := []string{"gpu-node", "cpu-node"}
	reply := vectors(1, names, true, []pb.Verdict{pb.Verdict_VERDICT_FITS, pb.Verdict_VERDICT_FITS}, []string{"", ""}, []byte{12, 97})
	reply.ScoreOnly = true
	core := &fakeCore{
		preFilter: func(*pb.PreFilterRequest) (*pb.PreFilterReply, error) { return reply, nil },
		reserve: func(*pb.ReserveRequest) (*pb.ReserveReply, error) {
			t.Error("Reserve reached the core for a pod that asks for no GPU")
			return &pb.ReserveReply{Reserved: true}, nil
		},
	}
	p, _ := start(t, core, time.Second)
	state, pod := framework.NewCycleState(), makePod("cpu-only")
	if _, st := p.PreFilter(context.Background(), state, pod, nil); !st.IsSkip() {
		t.Fatalf("PreFilter = %v, want Skip (no GPU filter)", st)
	}
	if st := p.PreScore(context.Background(), state, pod, nil); st != nil {
		t.Fatalf("PreScore = %v, want success: the core scored the nodes", st)
	}
	for i, name := range names {
		if score, st := p.Score(context.Background(), state, pod, nodeInfo(name)); st != nil || score != int64(reply.Scores[i]) {
			t.Errorf("Score(%s) = %d %v, want %d", name, score, st, reply.Scores[i])
		}
	}
	if st := p.Reserve(context.Background(), state, pod, "cpu-node"); !st.IsSuccess() {
		t.Errorf("Reserve = %v, want Success without the core", st)
	}
	p.Unreserve(context.Background(), state, pod, "cpu-node")
	if len(core.unreserved) != 0 {
		t.Errorf("Unreserve reached the core: %v", core.unreserved)
	}
	if st := p.Bind(context.Background(), state, pod, "cpu-node"); !st.IsSkip() {
		t.Errorf("Bind = %v, want Skip (the default binder binds it)", st)
	}
}

func TestPreFilterNamesTheUsableNodesOnALargeEnoughTable(t *testing.T) {
	const fits, notNow, never = pb.Verdict_VERDICT_FITS, pb.Verdict_VERDICT_NOT_NOW, pb.Verdict_VERDICT_NEVER
	repeat := func(n int, v pb.Verdict) []pb.Verdict {
		out := make([]pb.Verdict, n)
		for i := range out {
			out[i] = v
		}
		return out
	}
	for _, tc := range []struct {
		name       string
		verdicts   []pb.Verdict
		narrowFrom int
		want       []string // nil: every node (no PreFilterResult)
	}{
		{"fits, not now and never: the first two", []pb.Verdict{fits, never, notNow, never}, 0, []string{"n0", "n2"}},
		{"a table below narrowFrom", []pb.Verdict{fits, never, notNow, never}, 5, nil},
		{"no node judged never", []pb.Verdict{fits, notNow, fits}, 0, nil},
		{"every node judged never: the reasons stay in the status", repeat(4, never), 0, nil},
		{"too few left out to pay for the set", append([]pb.Verdict{never}, repeat(99, fits)...), 0, nil},
		{"enough left out", append(repeat(2, never), repeat(100, fits)...), 0, names(2, 102)},
		{"one in 64 left out", append(repeat(2, never), repeat(128, notNow)...), 0, names(2, 130)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			table := names(0, len(tc.verdicts))
			scores := make([]byte, len(table))
			reply := vectors(1, table, true, tc.verdicts, make([]string, len(table)), scores)
			p, _ := start(t, &fakeCore{preFilter: func(*pb.PreFilterRequest) (*pb.PreFilterReply, error) { return reply, nil }},
				time.Second)
			p.narrowFrom = tc.narrowFrom
			result, st := p.PreFilter(context.Background(), framework.NewCycleState(), makePod("p"), nil)
			if !st.IsSuccess() {
				t.Fatalf("PreFilter: %v", st)
			}
			if tc.want == nil {
				if !result.AllNodes() {
					t.Fatalf("PreFilterResult = %v, want every node", sets.List(result.NodeNames))
				}
				return
			}
			if result.AllNodes() || !result.NodeNames.Equal(sets.New(tc.want...)) {
				t.Fatalf("PreFilterResult = %v, want %v", result, tc.want)
			}
		})
	}
}

// names are n<from>..n<to-1>.
func names(from, to int) []string {
	out := make([]string, 0, to-from)
	for i := from; i < to; i++ {
		out = append(out, fmt.Sprintf("n%d", i))
	}
	return out
}
