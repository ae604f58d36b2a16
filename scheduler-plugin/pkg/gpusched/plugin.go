// Package gpusched is the GpuSched scheduling-framework plugin: kube-scheduler's way into the
// gpusched core over gRPC (gpusched.scheduling.v1, gpusched_api/scheduling/v1/scheduling.proto).
//
// It translates and decides nothing. PreFilter makes the one round trip of a scheduling cycle and
// keeps the answer (per-node verdicts, reasons and scores, indexed by the node table both sides
// share) in the CycleState; Filter, PreScore and Score are lookups in it (except Filter on a node the
// cycle changed — preemption's dry run, nominated pods, whatif.go — which the core judges as
// changed). Reserve and Unreserve are the core ledger's assume and forget; Bind binds a GPU pod with one Binding carrying the
// annotations Reserve returned (assigned GPUs, decision id); other pods go to the default binder.
//
// Gangs: the core plans a whole group at a member's PreFilter (whose PreFilterResult is then the
// member's planned node) and tells Reserve the member's place at the barrier. Permit is the
// barrier, with coscheduling's semantics: a member waits until the core says its group is
// complete, and the member that completes it allows every waiting sibling; a member that stops
// waiting (timeout, rejection) is unreserved, and Unreserve rejects its waiting siblings, so no
// group is ever bound in part. The only state the plugin keeps is which waiting pod belongs to
// which group (waitingGangs).
package gpusched

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	pb "github.com/gpusched/gpusched/scheduler-plugin/gen/scheduling/v1"
)

// Name is the plugin's name in a KubeSchedulerConfiguration profile.
const Name = "GpuSched"

const (
	answerKey      fwk.StateKey = "PreFilter" + Name
	reservationKey fwk.StateKey = "Reserve" + Name
)

// Plugin is GpuSched. The core's state (connection, node table) is in core; per-cycle state is in
// the CycleState, never in the plugin.
type Plugin struct {
	handle  fwk.Handle
	core    *core
	waiting *waitingGangs
	// narrowFrom: the table size from which PreFilter returns a PreFilterResult (Args.NarrowFromNodes)
	narrowFrom int
}

var (
	_ fwk.PreFilterPlugin     = (*Plugin)(nil)
	_ fwk.PreFilterExtensions = (*Plugin)(nil)
	_ fwk.FilterPlugin        = (*Plugin)(nil)
	_ fwk.PostFilterPlugin    = (*Plugin)(nil)
	_ fwk.PreScorePlugin      = (*Plugin)(nil)
	_ fwk.ScorePlugin         = (*Plugin)(nil)
	_ fwk.ReservePlugin       = (*Plugin)(nil)
	_ fwk.PermitPlugin        = (*Plugin)(nil)
	_ fwk.BindPlugin          = (*Plugin)(nil)
	_ fwk.EnqueueExtensions   = (*Plugin)(nil)
	_ fwk.SignPlugin          = (*Plugin)(nil)
)

// SpecSignerName names GpuSched's fragment of a pod's signature (fwk.SignPlugin).
const SpecSignerName = "gpusched.io/spec"

// New is GpuSched's factory (app.WithPlugin(Name, New)). It decodes and checks the args, opens a
// lazy connection to the core and greets it in the background: a core that is not up yet delays
// GPU pods (their status says so), never the scheduler's start. It keeps the core's requeue
// stream open (see watchRequeue) for the scheduler's lifetime.
func New(ctx context.Context, obj runtime.Object, handle fwk.Handle) (fwk.Plugin, error) {
	args, err := decodeArgs(obj)
	if err != nil {
		return nil, err
	}
	conn, err := newFrameClient(args.Address)
	if err != nil {
		return nil, fmt.Errorf("pluginConfig[%s].args.address %q: %w", Name, args.Address, err)
	}
	p := newPlugin(handle, newCore(args.Address, args.Timeout.Duration, args.AnswerMaxAge.Duration, args.ConfirmLinger.Duration,
		args.AnswerAudit, conn), *args.NarrowFromNodes)
	go p.core.hello(ctx)
	// The pod lister registered now, before kube-scheduler starts its informers.
	podInformer := handle.SharedInformerFactory().Core().V1().Pods()
	pods := podInformer.Lister()
	if _, err := podInformer.Informer().AddEventHandler(capacityFreed{answers: p.core.answers}); err != nil {
		return nil, fmt.Errorf("%s: watching pods for freed GPUs: %w", Name, err)
	}
	go p.core.watchRequeue(ctx, activator{pods: pods, activate: handle.Activate})
	go func() {
		<-ctx.Done()
		_ = conn.Close()
	}()
	return p, nil
}

func newPlugin(handle fwk.Handle, c *core, narrowFrom int) *Plugin {
	return &Plugin{handle: handle, core: c, waiting: &waitingGangs{gang: map[types.UID]string{}}, narrowFrom: narrowFrom}
}

// Name implements fwk.Plugin.
func (p *Plugin) Name() string { return Name }

// SignPod takes part in kube-scheduler's opportunistic batching (beta, on by default since 1.35:
// the next pod of the same signature is offered the previous cycle's best remaining node, one node
// filtered instead of all). A profile with one plugin that cannot sign turns batching off for every
// pod; with the default PodTopologySpread (system default constraints) no pod is signable anyway
// (the throughput bench's rows say so for stock and plugin mode alike), so this matters where that
// plugin runs without default constraints. The core judges a pod by its spec key (specKey: what
// its demand parsing reads), so pods of one key get one answer on nodes in one state; the fragment
// is that key. A batched pod still runs PreFilter (its own answer) and Filter on the node it is
// offered, and Reserve stays the core's: a gang member, whose answer depends on its group as well,
// offered a node other than its planned one fails Filter there and is judged over every node. A
// batch lasts at most 500 ms (kube-scheduler's maxBatchAge), as the answer cache's groups a second.
func (p *Plugin) SignPod(_ context.Context, pod *v1.Pod) ([]fwk.SignFragment, *fwk.Status) {
	key, err := specKey(pod)
	if err != nil {
		return nil, fwk.NewStatus(fwk.Unschedulable, err.Error())
	}
	return []fwk.SignFragment{{Key: SpecSignerName, Value: hex.EncodeToString([]byte(key))}}, nil
}

// answer is the core's PreFilter answer for this cycle. Immutable once written, so Clone shares it.
type answer struct {
	reply     *pb.PreFilterReply
	table     *nodeTable // the table reply's vectors are indexed by; nil for a skip
	fromCache bool       // the plugin answered from the core's cacheable answers (answerCache)
	key       string     // with fromCache: the pod's spec key the answers were the core's for
}

func (a *answer) Clone() fwk.StateData { return a }

// placesGPUs: the pod asks for GPUs and the core judged it, so Reserve, Unreserve and the
// preemption dry run's AddPod/RemovePod have GPUs of gpusched's to account for. A skipped pod
// (no GPUs) and a score-only one (no GPUs, scored for the CPU it takes) have none.
func (a *answer) placesGPUs() bool { return a.table != nil && !a.reply.GetScoreOnly() }

// reservation holds the annotations Reserve got from the core, for Bind to write, and for a
// gang member its place at the Permit barrier; or, for a reservation the plugin took itself, its
// confirmation (Bind takes the annotations from the core's answer to it).
type reservation struct {
	annotations       map[string]string
	barrier           *pb.Barrier   // nil unless a gang member
	permitRan         bool          // set by Permit: a member's Bind without it means Permit is not enabled
	confirm           *confirmation // set when the plugin reserved on its cached answer (confirm.go)
	keepsEarlierHold  bool          // the core re-chose the pod's own earlier hold (ReserveReply.keeps_earlier_hold)
	bindMayHaveLanded bool          // set by Bind: its Binding failed with no answer saying the write did not land
}

// mayBeBound says whether the pod may be bound with this reservation's GPUs, so its Unreserve
// must ask the core to keep them held (UnreserveRequest.keep_hold).
func (r *reservation) mayBeBound() bool {
	if r.bindMayHaveLanded || r.keepsEarlierHold {
		return true
	}
	return r.confirm != nil && r.confirm.err == nil && r.confirm.reply.GetKeepsEarlierHold()
}

func (r *reservation) Clone() fwk.StateData { return r }

// PreFilter asks the core once for the whole cycle.
//
// When the core cannot be asked (unreachable, past the deadline, version skew) or says it cannot
// judge now (not ready, its own fault), the status is Error, not Unschedulable: kube-scheduler
// puts a pod whose cycle ended in Error into the backoff queue and retries it after its backoff
// (1 s doubling to 10 s), whatever the cluster does, whereas an Unschedulable pod waits in the
// unschedulable pool for a cluster event (or five minutes). The fault is ours, not the pod's or
// the cluster's, so the pod must come back by itself; the message lands in its PodScheduled
// condition and FailedScheduling event.
func (p *Plugin) PreFilter(ctx context.Context, state fwk.CycleState, pod *v1.Pod, _ []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	a, err := p.core.preFilter(ctx, pod)
	if err != nil {
		return nil, fwk.AsStatus(err)
	}
	state.Write(answerKey, a)
	reply := a.reply
	switch {
	case reply.GetSkip(): // no GPUs asked: Filter (and, via PreScore, Score) are skipped
		return nil, fwk.NewStatus(fwk.Skip)
	case reply.GetScoreOnly(): // no GPUs asked, but the core scores the nodes: Filter alone is skipped
		return nil, fwk.NewStatus(fwk.Skip)
	case reply.GetError() != "":
		return nil, fwk.AsStatus(fmt.Errorf("%s; the pod is retried", reply.GetError()))
	case reply.GetUnresolvable() != "":
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, reply.GetUnresolvable())
	case len(reply.GetOnlyNodes()) > 0: // a gang member's planned node: filter no other
		return &fwk.PreFilterResult{NodeNames: sets.New(reply.GetOnlyNodes()...)}, nil
	}
	return a.usable(p.narrowFrom), nil
}

// narrowGain: a PreFilterResult is returned only when it leaves out at least one node in this many
// of those it names. Building the set costs ~0.1 us per named node; a node left out saves every
// Filter plugin's run on it (~8 us at kube-scheduler's defaults), so below this a set costs more
// than it saves.
const narrowGain = 64

// usable is the PreFilterResult of a GPU pod's answer on a table of at least narrowFrom nodes: the
// nodes the core judged to fit now or once pods leave (NOT_NOW: preemption's candidates, which
// kube-scheduler only tries on nodes in the result). Only nodes judged NEVER are left out, whose
// Filter would say UnschedulableAndUnresolvable anyway, so no node that could fit is dropped. nil
// (every node) on a smaller table, when the set would leave out too few nodes to pay for itself,
// and when it would be empty: a pod no node can take keeps gpusched's reasons in its status.
func (a *answer) usable(narrowFrom int) *fwk.PreFilterResult {
	names, verdicts := a.table.names, a.reply.GetVerdicts()
	if len(names) < narrowFrom || len(verdicts) != len(names) {
		return nil
	}
	never := 0
	for _, v := range verdicts {
		if pb.Verdict(v) == pb.Verdict_VERDICT_NEVER {
			never++
		}
	}
	if never == 0 || never == len(names) || never*narrowGain < len(names)-never {
		return nil
	}
	usable := make(sets.Set[string], len(names)-never)
	for i, v := range verdicts {
		if pb.Verdict(v) != pb.Verdict_VERDICT_NEVER {
			usable.Insert(names[i])
		}
	}
	return &fwk.PreFilterResult{NodeNames: usable}
}

func readAnswer(state fwk.CycleState) (*answer, *fwk.Status) {
	data, err := state.Read(answerKey)
	if err != nil {
		return nil, fwk.AsStatus(fmt.Errorf("%s: no PreFilter answer in the cycle state: %w", Name, err))
	}
	a, ok := data.(*answer)
	if !ok {
		return nil, fwk.AsStatus(fmt.Errorf("%s: cycle state %q holds %T", Name, answerKey, data))
	}
	return a, nil
}

// Filter looks the node up in the cycle's answer, unless the cycle changed the node (preemption's
// dry run, nominated pods: see PreFilterExtensions) in a way that could change the verdict: then
// the core judges it as changed. Removing pods can make a node fit (and once a dry run removed any,
// every Filter of that node asks, sparing victims included), adding pods cannot, and a node the pod
// can never fit stays so.
func (p *Plugin) Filter(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodeInfo fwk.NodeInfo) *fwk.Status {
	a, st := readAnswer(state)
	if st != nil {
		return st
	}
	node := nodeInfo.Node().Name
	verdict := a.verdict(node)
	pc := changed(state, node)
	if pc == nil || verdict.Code() == fwk.UnschedulableAndUnresolvable || (verdict != nil && !pc.removedAny) {
		return verdict
	}
	return p.whatIf(ctx, pod, nodeInfo, pc)
}

// verdict maps the core's verdict for node to a framework status (nil is Success).
func (a *answer) verdict(node string) *fwk.Status {
	i, ok := a.table.index[node]
	if !ok {
		// kube-scheduler's informer saw the node before the core's did: may fit once it has.
		return fwk.NewStatus(fwk.Unschedulable, fmt.Sprintf("gpusched has not seen node %s yet", node))
	}
	reason := ""
	if ri := a.reply.GetReasonIndex()[i]; int(ri) < len(a.reply.GetReasons()) {
		reason = a.reply.GetReasons()[ri]
	}
	switch pb.Verdict(a.reply.GetVerdicts()[i]) {
	case pb.Verdict_VERDICT_FITS:
		return nil
	case pb.Verdict_VERDICT_NOT_NOW:
		return fwk.NewStatus(fwk.Unschedulable, orDefault(reason, "gpusched: the pod's GPUs are not free on this node now"))
	case pb.Verdict_VERDICT_NEVER:
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, orDefault(reason, "gpusched: the pod's GPUs can never fit on this node"))
	default:
		return fwk.AsStatus(fmt.Errorf("gpusched core answered unknown verdict %d for node %s", a.reply.GetVerdicts()[i], node))
	}
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// PostFilter runs when no node passed Filter; it is informational (always Unschedulable, so
// DefaultPreemption, after it in the profile, runs as ever). When the cycle was judged on the
// plugin's cached answers, which may be behind the core (capacity freed since), the pod is
// activated and its next PreFilter asks the core: a pod never waits on the cache's word alone.
// Preemption on such a cycle is safe either way: its dry run asks the core (FilterWhatIf), which
// judges on its own state.
func (p *Plugin) PostFilter(ctx context.Context, state fwk.CycleState, pod *v1.Pod, _ fwk.NodeToStatusReader) (*fwk.PostFilterResult, *fwk.Status) {
	// Also a cycle that found a node "not now" only while the core confirms a reservation there:
	// nothing else would requeue the pod once the confirmation lands (or is refused).
	if a, st := readAnswer(state); st == nil && (a.fromCache || slices.Contains(a.reply.GetReasons(), confirmingReason)) {
		p.core.answers.askFor(pod.UID)
		// The pod is in flight: kube-scheduler requeues it when this cycle hands it back.
		p.handle.Activate(klog.FromContext(ctx), map[string]*v1.Pod{pod.Namespace + "/" + pod.Name: pod})
	}
	return nil, fwk.NewStatus(fwk.Unschedulable)
}

// PreScore skips Score for pods PreFilter skipped (a Skip from PreFilter skips only Filter); a
// score-only pod's answer has a table, so it is scored.
func (p *Plugin) PreScore(_ context.Context, state fwk.CycleState, _ *v1.Pod, _ []fwk.NodeInfo) *fwk.Status {
	a, st := readAnswer(state)
	if st != nil {
		return st
	}
	if a.table == nil {
		return fwk.NewStatus(fwk.Skip)
	}
	return nil
}

// Score is the core's score for the node, already 0..100 (fwk.MaxNodeScore).
func (p *Plugin) Score(_ context.Context, state fwk.CycleState, _ *v1.Pod, nodeInfo fwk.NodeInfo) (int64, *fwk.Status) {
	a, st := readAnswer(state)
	if st != nil {
		return 0, st
	}
	name := nodeInfo.Node().Name
	i, ok := a.table.index[name]
	if !ok { // Filter rejected it; the framework scores only nodes that passed
		return 0, nil
	}
	return min(int64(a.reply.GetScores()[i]), fwk.MaxNodeScore), nil
}

// ScoreExtensions: none; the core's scores are in the framework's range already.
func (p *Plugin) ScoreExtensions() fwk.ScoreExtensions { return nil }

// Reserve takes the pod's GPUs on the chosen node in the core's ledger. A refusal (the capacity
// was taken since PreFilter) is Unschedulable: the pod goes back to the queue and is judged anew.
// A refusal of a node the plugin's cache answered for is Error instead (the cache was stale, not
// the cluster full: the pod is retried after its backoff, and the core is asked next time).
//
// A pod answered from the cache, on a node whose move the answer named, is reserved by the plugin
// itself (issue 43): the node is judged in its new group from the next cycle on, and the core
// confirms the reservation off this cycle (confirm.go), batched with others; Bind waits for that,
// and a refusal there fails the binding cycle (the pod is unreserved and retried). The core stays
// authoritative: it reserves on its own state, as Reserve would, and nothing is promised twice.
func (p *Plugin) Reserve(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodeName string) *fwk.Status {
	a, st := readAnswer(state)
	if st != nil || !a.placesGPUs() {
		return nil // not a GPU pod (or PreFilter never ran): nothing to reserve
	}
	if a.fromCache && p.core.answers.assume(a.key, a.table, nodeName) {
		state.Write(reservationKey, &reservation{confirm: p.core.confirms.later(pod, a.key, nodeName)})
		return nil
	}
	reply, err := p.core.reserve(ctx, pod, nodeName, a.fromCache)
	if err != nil {
		return fwk.AsStatus(err)
	}
	if !reply.GetReserved() {
		refusal := orDefault(reply.GetRefusal(), "gpusched refused the reservation")
		if a.fromCache {
			p.core.answers.forget()
			return fwk.AsStatus(fmt.Errorf("%s (the plugin's cached answer was stale; the pod is retried)", refusal))
		}
		return fwk.NewStatus(fwk.Unschedulable, refusal)
	}
	klog.FromContext(ctx).V(4).Info("gpusched reserved", "pod", klog.KObj(pod), "node", nodeName, "summary", reply.GetSummary())
	state.Write(reservationKey, &reservation{annotations: reply.GetAnnotations(), barrier: reply.GetBarrier(),
		keepsEarlierHold: reply.GetKeepsEarlierHold()})
	return nil
}

// Permit is the gang barrier. A pod that is no gang member passes. A member that completed its
// group allows every sibling waiting at Permit and passes; any other member waits for that, at
// most until its plan's deadline (the framework then rejects it, and Unreserve rejects the rest).
func (p *Plugin) Permit(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodeName string) (*fwk.Status, time.Duration) {
	r := readReservation(state)
	if r == nil || r.barrier == nil {
		return nil, 0
	}
	r.permitRan = true // the binding cycle's Bind reads it; the scheduling cycle is done writing
	gang := r.barrier.GetGang()
	if r.barrier.GetOpen() {
		for _, uid := range p.waiting.members(gang) {
			if wp := p.handle.GetWaitingPod(uid); wp != nil {
				wp.Allow(Name)
			}
		}
		return nil, 0
	}
	wait := time.Duration(r.barrier.GetWaitSeconds() * float64(time.Second))
	if wait <= 0 {
		return fwk.NewStatus(fwk.Unschedulable, fmt.Sprintf("gang %s: its plan's deadline passed before this member was reserved", gang)), 0
	}
	p.waiting.add(pod.UID, gang)
	klog.FromContext(ctx).V(4).Info("gpusched gang member waits at Permit", "pod", klog.KObj(pod), "gang", gang, "wait", wait)
	return fwk.NewStatus(fwk.Wait, fmt.Sprintf("gang %s: waiting for the rest of the group", gang)), wait
}

// Unreserve releases the reservation (kube-scheduler calls it after any later failure, and may
// call it without a Reserve). For a gang member it first rejects every sibling still waiting at
// Permit (coscheduling's semantics: the core releases the whole group's plan when told of one).
// Best effort: a core that cannot be told logs it; the core's own bookkeeping expires
// reservations that never bind.
//
// The call runs under the plugin's own deadline, not under ctx's cancellation: kube-scheduler may
// unreserve under a context it has already canceled. Its pod-group cycle (1.37, GenericWorkload:
// Kubernetes' own gang scheduling) reserves each member tentatively and unreserves them all after
// the group's algorithm returned and canceled its context (podGroupSchedulingAlgorithm in
// pkg/scheduler/schedule_one_podgroup.go); a release the core never heard would keep the GPUs held
// and refuse the same pod's Reserve in the binding cycle that follows.
func (p *Plugin) Unreserve(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodeName string) {
	ctx = context.WithoutCancel(ctx)
	if a, st := readAnswer(state); st != nil || !a.placesGPUs() {
		return
	}
	reason := "kube-scheduler unreserved the pod"
	r := readReservation(state)
	if r != nil && r.confirm != nil {
		if p.core.withdraw(r.confirm) {
			return // never sent: the core holds nothing for it
		}
		<-r.confirm.done // within the call's deadline
		if r.confirm.err == nil && !r.confirm.reply.GetReserved() {
			return // refused: the core holds nothing for it
		}
	}
	if r != nil && r.barrier != nil {
		gang := r.barrier.GetGang()
		p.waiting.remove(pod.UID)
		for _, uid := range p.waiting.members(gang) {
			p.handle.RejectWaitingPod(uid) // each rejected sibling is unreserved in turn
		}
		reason = fmt.Sprintf("kube-scheduler unreserved gang %s's member (timed out or rejected at Permit, or a later step failed)", gang)
	}
	if err := p.core.unreserve(ctx, pod, nodeName, reason, r != nil && r.mayBeBound()); err != nil {
		klog.FromContext(ctx).Error(err, "gpusched Unreserve failed", "pod", klog.KObj(pod), "node", nodeName)
	}
}

// bindMayHaveLanded says whether a failed Binding's write may have landed: no answer said it did
// not. An API status below 500 is the apiserver's refusal, but for 409 "already assigned" (an
// earlier write of this binding landed, its answer lost); a timeout, a broken connection or a 5xx
// may have landed. Freed then, the pod's GPUs would be promised to the next pod while it runs on
// them (tests/e2e/test_faults.py restarts the apiserver mid-burst).
func bindMayHaveLanded(err error) bool {
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return true
	}
	answer := status.Status()
	return answer.Code == 0 || answer.Code >= http.StatusInternalServerError ||
		(answer.Code == http.StatusConflict && strings.Contains(answer.Message, "already assigned"))
}

// waitingGangs is which pod waiting at Permit belongs to which gang: what Permit's allow and
// Unreserve's reject need, since a WaitingPod does not say. Entries leave at Bind or Unreserve.
type waitingGangs struct {
	mu   sync.Mutex
	gang map[types.UID]string
}

func (w *waitingGangs) add(uid types.UID, gang string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.gang[uid] = gang
}

func (w *waitingGangs) remove(uid types.UID) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.gang, uid)
}

func (w *waitingGangs) members(gang string) []types.UID {
	w.mu.Lock()
	defer w.mu.Unlock()
	var uids []types.UID
	for uid, g := range w.gang {
		if g == gang {
			uids = append(uids, uid)
		}
	}
	return uids
}

func readReservation(state fwk.CycleState) *reservation {
	data, err := state.Read(reservationKey)
	if err != nil {
		return nil
	}
	r, _ := data.(*reservation)
	return r
}

// Bind binds a pod gpusched reserved GPUs for with one Binding that carries Reserve's annotations
// (gpusched.io/assigned-gpus, -gpu-indices, decision-id): the apiserver copies a Binding's
// annotations onto the pod, as for the extender's bind, so the pod is never bound without the GPUs
// it was given and one write does both (a PreBind patch and the default binder's Binding were two
// writes per pod, and needed "patch pods" for the scheduler's identity). Any other pod is Skip: the
// default binder binds it. A failed write is an Error: the pod is unreserved and retried. A gang
// member, past Permit, asks the core for its annotations first: they carry the group's commit
// record, known only once it completed.
func (p *Plugin) Bind(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodeName string) *fwk.Status {
	r := readReservation(state)
	if r == nil {
		return fwk.NewStatus(fwk.Skip)
	}
	annotations := r.annotations
	if r.confirm != nil {
		confirmed, err := p.core.confirmed(ctx, r.confirm)
		if err != nil {
			return fwk.AsStatus(err)
		}
		annotations = confirmed
	}
	if r.barrier != nil {
		p.waiting.remove(pod.UID)
		if !r.permitRan {
			return fwk.AsStatus(fmt.Errorf("gang %s: GpuSched's Permit did not run for member %s/%s, so its group was never "+
				"waited for: enable GpuSched at the permit extension point of the profile (as manifests/overlays/plugin-mode/"+
				"scheduler-config.yaml does)", r.barrier.GetGang(), pod.Namespace, pod.Name))
		}
		reply, err := p.core.permitted(ctx, pod, nodeName)
		if err != nil {
			return fwk.AsStatus(err)
		}
		if !reply.GetPermitted() {
			return fwk.AsStatus(fmt.Errorf("gpusched withdrew gang member %s/%s's place on %s: %s", pod.Namespace, pod.Name, nodeName,
				orDefault(reply.GetRefusal(), "no reason given")))
		}
		annotations = reply.GetAnnotations()
	}
	binding := &v1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID, Annotations: annotations},
		Target:     v1.ObjectReference{Kind: "Node", Name: nodeName},
	}
	if err := p.handle.ClientSet().CoreV1().Pods(pod.Namespace).Bind(ctx, binding, metav1.CreateOptions{}); err != nil {
		r.bindMayHaveLanded = bindMayHaveLanded(err)
		return fwk.AsStatus(fmt.Errorf("gpusched: binding pod %s/%s to %s with its assigned GPUs: %w", pod.Namespace, pod.Name, nodeName, err))
	}
	return nil
}
