package gpusched

import (
	"context"
	"fmt"
	"slices"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	fwk "k8s.io/kube-scheduler/framework"

	pb "github.com/gpusched/gpusched/scheduler-plugin/gen/scheduling/v1"
)

// PreFilterExtensions are GpuSched's answer to "what if": kube-scheduler's preemption dry run
// removes lower-priority pods from a candidate node (RemovePod), then adds them back one by one to
// spare each victim it can (AddPod); and before judging a pod on a node, the framework adds the
// pods nominated to that node with at least its priority (AddPod). The plugin records each change
// in the CycleState (the dry run clones it per candidate node), and Filter on a changed node asks
// the core (FilterWhatIf) instead of reading the PreFilter answer, which was judged with every
// victim in place and no nominated pod. So preemption evicts only pods whose GPUs make room by
// gpusched's rules, and a nominated pod's GPUs are not given to a lower-priority pod meanwhile.
func (p *Plugin) PreFilterExtensions() fwk.PreFilterExtensions { return p }

const changesKey fwk.StateKey = "Changes" + Name

// nodeChanges is what this cycle changed on each node: pods removed from it, and pods added to it
// that were not on it, in the order they were added. Cloned deep: each clone changes on its own.
type nodeChanges struct {
	nodes map[string]*podChanges
}

type podChanges struct {
	removed    []*pb.Pod
	added      []*pb.Pod
	removedAny bool // a pod was removed in this cycle, even if added back since (a dry run)
}

func (c *nodeChanges) Clone() fwk.StateData {
	nodes := make(map[string]*podChanges, len(c.nodes))
	for name, pc := range c.nodes {
		nodes[name] = &podChanges{removed: slices.Clone(pc.removed), added: slices.Clone(pc.added), removedAny: pc.removedAny}
	}
	return &nodeChanges{nodes: nodes}
}

func readChanges(state fwk.CycleState) *nodeChanges {
	data, err := state.Read(changesKey)
	if err != nil {
		return nil
	}
	c, _ := data.(*nodeChanges)
	return c
}

// changesOn is the node's changes, created (and the state's record with them) when absent.
func changesOn(state fwk.CycleState, node string) *podChanges {
	c := readChanges(state)
	if c == nil {
		c = &nodeChanges{nodes: map[string]*podChanges{}}
		state.Write(changesKey, c)
	}
	pc := c.nodes[node]
	if pc == nil {
		pc = &podChanges{}
		c.nodes[node] = pc
	}
	return pc
}

func indexOf(pods []*pb.Pod, uid types.UID) int {
	return slices.IndexFunc(pods, func(p *pb.Pod) bool { return p.GetUid() == string(uid) })
}

// AddPod: a pod the cycle removed from the node is back (a spared victim); any other pod is placed
// there (a nominated pod), after those added before it.
func (p *Plugin) AddPod(_ context.Context, state fwk.CycleState, _ *v1.Pod, podInfo fwk.PodInfo, nodeInfo fwk.NodeInfo) *fwk.Status {
	if a, st := readAnswer(state); st != nil || !a.placesGPUs() {
		return nil // not a GPU pod's cycle: nothing of ours to judge differently
	}
	pc := changesOn(state, nodeInfo.Node().Name)
	return move(podInfo.GetPod(), &pc.removed, &pc.added)
}

// RemovePod: a pod the cycle added is gone again; any other pod leaves the node (a victim).
func (p *Plugin) RemovePod(_ context.Context, state fwk.CycleState, _ *v1.Pod, podInfo fwk.PodInfo, nodeInfo fwk.NodeInfo) *fwk.Status {
	if a, st := readAnswer(state); st != nil || !a.placesGPUs() {
		return nil
	}
	pc := changesOn(state, nodeInfo.Node().Name)
	pc.removedAny = true
	return move(podInfo.GetPod(), &pc.added, &pc.removed)
}

// move records pod as going from one side of a node's changes to the other: taken off "from"
// when it is there (a change undone), else put on "to" once.
func move(pod *v1.Pod, from, to *[]*pb.Pod) *fwk.Status {
	if i := indexOf(*from, pod.UID); i >= 0 {
		*from = slices.Delete(*from, i, i+1)
		return nil
	}
	if indexOf(*to, pod.UID) >= 0 {
		return nil
	}
	wire, err := wirePod(pod)
	if err != nil {
		return fwk.AsStatus(err)
	}
	*to = append(*to, wire)
	return nil
}

// changed is the node's changes when the cycle changed it (even back to where it was), else nil.
func changed(state fwk.CycleState, node string) *podChanges {
	if c := readChanges(state); c != nil {
		return c.nodes[node]
	}
	return nil
}

// whatIf asks the core to judge the pod on a node the cycle changed, and maps its verdict as
// Filter does. It names every pod the node info holds now: the core judges a pod it still holds
// there but kube-scheduler no longer sees as gone (kube-scheduler saw its deletion first), so a dry
// run that spares every victim it can is never told a deleted pod still stands in the way. A core
// that cannot be asked is an Error: the node is not judged fit.
func (p *Plugin) whatIf(ctx context.Context, pod *v1.Pod, nodeInfo fwk.NodeInfo, pc *podChanges) *fwk.Status {
	node := nodeInfo.Node().Name
	uids := make([]string, 0, len(nodeInfo.GetPods()))
	for _, pi := range nodeInfo.GetPods() {
		uids = append(uids, string(pi.GetPod().UID))
	}
	reply, err := p.core.filterWhatIf(ctx, pod, node, pc.removed, pc.added, uids)
	if err != nil {
		return fwk.AsStatus(err)
	}
	reason := reply.GetReason()
	switch reply.GetVerdict() {
	case pb.Verdict_VERDICT_FITS:
		return nil
	case pb.Verdict_VERDICT_NOT_NOW:
		return fwk.NewStatus(fwk.Unschedulable, orDefault(reason, "gpusched: the pod's GPUs would not be free on this node"))
	case pb.Verdict_VERDICT_NEVER:
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, orDefault(reason, "gpusched: the pod's GPUs can never fit on this node"))
	default:
		return fwk.AsStatus(fmt.Errorf("gpusched core answered unknown verdict %d for node %s", reply.GetVerdict(), node))
	}
}
