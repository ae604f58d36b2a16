package gpusched

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	pb "github.com/gpusched/gpusched/scheduler-plugin/gen/scheduling/v1"
)

// whatIfCore is a fakeCore that also answers FilterWhatIf and records what each request named.
type whatIfCore struct {
	fakeCore
	answer   func(*pb.FilterWhatIfRequest) (*pb.FilterWhatIfReply, error)
	asked    sync.Mutex
	changes  []string   // per request: "node -removed,... +added,..." (pod names)
	nodePods [][]string // per request: the UIDs of the pods kube-scheduler sees on the node
}

func (f *whatIfCore) FilterWhatIf(_ context.Context, r *pb.FilterWhatIfRequest) (*pb.FilterWhatIfReply, error) {
	f.asked.Lock()
	f.changes = append(f.changes, describeChanges(r))
	f.nodePods = append(f.nodePods, r.GetNodePods().GetUids())
	f.asked.Unlock()
	return f.answer(r)
}

func describeChanges(r *pb.FilterWhatIfRequest) string {
	names := func(pods []*pb.Pod) string {
		var out []string
		for _, p := range pods {
			out = append(out, p.GetName())
		}
		return strings.Join(out, ",")
	}
	return r.GetNode() + " -" + names(r.GetRemoved()) + " +" + names(r.GetAdded())
}

// A GPU pod's cycle over two nodes: "full" is not free now, "never" can never hold the pod,
// "open" fits. The fake core's what-if answers FITS when anything was removed, else NOT_NOW.
func whatIfPlugin(t *testing.T, answer func(*pb.FilterWhatIfRequest) (*pb.FilterWhatIfReply, error)) (*Plugin, *whatIfCore) {
	t.Helper()
	names := []string{"full", "never", "open"}
	f := &whatIfCore{answer: answer}
	f.preFilter = func(r *pb.PreFilterRequest) (*pb.PreFilterReply, error) {
		return vectors(3, names, r.GetTableGeneration() != 3,
			[]pb.Verdict{pb.Verdict_VERDICT_NOT_NOW, pb.Verdict_VERDICT_NEVER, pb.Verdict_VERDICT_FITS},
			[]string{"only 0 of 8 GPUs free; pod needs 4", "node has 0 whole GPUs; pod needs 2", ""}, []byte{0, 0, 50}), nil
	}
	p, _ := start(t, f, time.Second)
	return p, f
}

func fitsWhenRemoved(r *pb.FilterWhatIfRequest) (*pb.FilterWhatIfReply, error) {
	if len(r.GetRemoved()) > 0 {
		return &pb.FilterWhatIfReply{Verdict: pb.Verdict_VERDICT_FITS}, nil
	}
	return &pb.FilterWhatIfReply{Verdict: pb.Verdict_VERDICT_NOT_NOW, Reason: "core: no room"}, nil
}

func podInfoOf(name string) fwk.PodInfo {
	info, err := framework.NewPodInfo(makePod(name))
	if err != nil {
		panic(err)
	}
	return info
}

func TestFilterOnChangedNodesAsksTheCore(t *testing.T) {
	type change struct {
		add  bool
		node string
		pod  string
	}
	for _, tc := range []struct {
		name    string
		changes []change
		node    string
		code    fwk.Code
		message string
		asked   []string // what the core was asked, in order
	}{
		{"an unchanged node is a lookup", nil, "full", fwk.Unschedulable, "only 0 of 8 GPUs free; pod needs 4", nil},
		{"victims removed: the core judges the node without them",
			[]change{{false, "full", "low-a"}, {false, "full", "low-b"}}, "full", fwk.Success, "",
			[]string{"full -low-a,low-b +"}},
		{"a victim spared again: the rest stay removed",
			[]change{{false, "full", "low-a"}, {false, "full", "low-b"}, {true, "full", "low-a"}}, "full", fwk.Success, "",
			[]string{"full -low-b +"}},
		{"every victim spared: still asked (the core may hold a pod kube-scheduler saw deleted)",
			[]change{{false, "full", "low-a"}, {true, "full", "low-a"}}, "full", fwk.Unschedulable, "core: no room",
			[]string{"full - +"}},
		{"another node's change does not touch this one",
			[]change{{false, "open", "low-a"}}, "full", fwk.Unschedulable, "only 0 of 8 GPUs free; pod needs 4", nil},
		{"a node the pod can never fit is not asked about",
			[]change{{false, "never", "low-a"}}, "never", fwk.UnschedulableAndUnresolvable,
			"node has 0 whole GPUs; pod needs 2", nil},
		{"a nominated pod on a fitting node: the core places it first",
			[]change{{true, "open", "nominated"}}, "open", fwk.Unschedulable, "core: no room",
			[]string{"open - +nominated"}},
		{"a nominated pod on a node that does not fit cannot make it fit: not asked",
			[]change{{true, "full", "nominated"}}, "full", fwk.Unschedulable, "only 0 of 8 GPUs free; pod needs 4", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, f := whatIfPlugin(t, fitsWhenRemoved)
			ctx, state, pod := context.Background(), framework.NewCycleState(), makePod("high")
			if _, st := p.PreFilter(ctx, state, pod, nil); !st.IsSuccess() {
				t.Fatalf("PreFilter: %v", st)
			}
			ext := p.PreFilterExtensions()
			for _, c := range tc.changes {
				var st *fwk.Status
				if c.add {
					st = ext.AddPod(ctx, state, pod, podInfoOf(c.pod), nodeInfo(c.node))
				} else {
					st = ext.RemovePod(ctx, state, pod, podInfoOf(c.pod), nodeInfo(c.node))
				}
				if !st.IsSuccess() {
					t.Fatalf("change %+v: %v", c, st)
				}
			}
			st := p.Filter(ctx, state, pod, nodeInfo(tc.node))
			if st.Code() != tc.code || st.Message() != tc.message {
				t.Errorf("Filter(%s) = %v %q, want %v %q", tc.node, st.Code(), st.Message(), tc.code, tc.message)
			}
			if !slices.Equal(f.changes, tc.asked) {
				t.Errorf("core asked %q, want %q", f.changes, tc.asked)
			}
		})
	}
}

// The dry run clones the cycle state per candidate node: a clone's changes are its own.
func TestChangesStayInTheirClone(t *testing.T) {
	p, f := whatIfPlugin(t, fitsWhenRemoved)
	ctx, state, pod := context.Background(), framework.NewCycleState(), makePod("high")
	if _, st := p.PreFilter(ctx, state, pod, nil); !st.IsSuccess() {
		t.Fatalf("PreFilter: %v", st)
	}
	first := state.Clone()
	if st := p.PreFilterExtensions().RemovePod(ctx, first, pod, podInfoOf("low-a"), nodeInfo("full")); !st.IsSuccess() {
		t.Fatal(st)
	}
	second := first.Clone()
	if st := p.PreFilterExtensions().AddPod(ctx, second, pod, podInfoOf("low-a"), nodeInfo("full")); !st.IsSuccess() {
		t.Fatal(st)
	}
	for _, tc := range []struct {
		name  string
		state fwk.CycleState
		code  fwk.Code
	}{{"original", state, fwk.Unschedulable}, {"victim removed", first, fwk.Success}, {"victim spared in the clone", second, fwk.Unschedulable}} {
		if st := p.Filter(ctx, tc.state, pod, nodeInfo("full")); st.Code() != tc.code {
			t.Errorf("%s: Filter = %v, want %v", tc.name, st, tc.code)
		}
	}
	if want := []string{"full -low-a +", "full - +"}; !slices.Equal(f.changes, want) {
		t.Errorf("core asked %q, want %q", f.changes, want)
	}
}

// The question names every pod kube-scheduler's node info holds (the dry run's removals applied).
func TestTheNodesPodsTravelWithTheQuestion(t *testing.T) {
	p, f := whatIfPlugin(t, fitsWhenRemoved)
	ctx, state, pod := context.Background(), framework.NewCycleState(), makePod("high")
	if _, st := p.PreFilter(ctx, state, pod, nil); !st.IsSuccess() {
		t.Fatalf("PreFilter: %v", st)
	}
	ni := nodeInfo("full")
	for _, name := range []string{"low-a", "low-b"} {
		ni.AddPodInfo(podInfoOf(name))
	}
	if st := p.PreFilterExtensions().RemovePod(ctx, state, pod, podInfoOf("low-a"), ni); !st.IsSuccess() {
		t.Fatal(st)
	}
	if err := ni.RemovePod(klog.Background(), makePod("low-a")); err != nil { // as the dry run does
		t.Fatal(err)
	}
	p.Filter(ctx, state, pod, ni)
	if want := [][]string{{"uid-low-b"}}; len(f.nodePods) != 1 || !slices.Equal(f.nodePods[0], want[0]) {
		t.Errorf("node pods sent %q, want %q", f.nodePods, want)
	}
}

func TestWhatIfVerdictsAndFaults(t *testing.T) {
	for _, tc := range []struct {
		name    string
		reply   *pb.FilterWhatIfReply
		err     error
		code    fwk.Code
		message string
	}{
		{"never", &pb.FilterWhatIfReply{Verdict: pb.Verdict_VERDICT_NEVER, Reason: "MIG slices cannot form a TP group"}, nil,
			fwk.UnschedulableAndUnresolvable, "MIG slices cannot form a TP group"},
		{"not now, the core's reason", &pb.FilterWhatIfReply{Verdict: pb.Verdict_VERDICT_NOT_NOW,
			Reason: "only 1 of 2 GPUs free (not counted as preemptible: gang-0, gang members)"}, nil,
			fwk.Unschedulable, "only 1 of 2 GPUs free (not counted as preemptible: gang-0, gang members)"},
		{"an old core that lacks the call", nil, status.Error(codes.Unimplemented, "unknown method FilterWhatIf"), fwk.Error,
			"gpusched core at unix:///fake/scheduling.sock is of an older release than this plugin (unknown method FilterWhatIf): run the plugin and the core of one gpusched release"},
		{"an unknown verdict", &pb.FilterWhatIfReply{Verdict: 9}, nil, fwk.Error, "gpusched core answered unknown verdict 9 for node full"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := whatIfPlugin(t, func(*pb.FilterWhatIfRequest) (*pb.FilterWhatIfReply, error) { return tc.reply, tc.err })
			ctx, state, pod := context.Background(), framework.NewCycleState(), makePod("high")
			if _, st := p.PreFilter(ctx, state, pod, nil); !st.IsSuccess() {
				t.Fatalf("PreFilter: %v", st)
			}
			if st := p.PreFilterExtensions().RemovePod(ctx, state, pod, podInfoOf("low-a"), nodeInfo("full")); !st.IsSuccess() {
				t.Fatal(st)
			}
			st := p.Filter(ctx, state, pod, nodeInfo("full"))
			if st.Code() != tc.code || st.Message() != tc.message {
				t.Errorf("Filter = %v %q, want %v %q", st.Code(), st.Message(), tc.code, tc.message)
			}
		})
	}
}

// A pod PreFilter skipped (no GPUs) records nothing: its extensions are no-ops.
func TestExtensionsOfASkippedPodRecordNothing(t *testing.T) {
	p, _ := whatIfPlugin(t, func(*pb.FilterWhatIfRequest) (*pb.FilterWhatIfReply, error) {
		return nil, errors.New("must not be asked")
	})
	state := framework.NewCycleState()
	state.Write(answerKey, &answer{reply: &pb.PreFilterReply{Skip: true}})
	ctx, pod := context.Background(), makePod("cpu-only")
	if st := p.PreFilterExtensions().RemovePod(ctx, state, pod, podInfoOf("low-a"), nodeInfo("full")); !st.IsSuccess() {
		t.Fatal(st)
	}
	if c := readChanges(state); c != nil {
		t.Errorf("changes recorded for a skipped pod: %+v", c.nodes)
	}
}
