package gpusched

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/component-base/metrics/testutil"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	pb "github.com/gpusched/gpusched/scheduler-plugin/gen/scheduling/v1"
)

// replica is a pod of one Deployment's spec: name and UID differ between replicas.
func replica(name string, edit ...func(*v1.Pod)) *v1.Pod {
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name), GenerateName: "vllm-",
			Labels: map[string]string{"app": "vllm", "pod-template-hash": "abc"}, Annotations: map[string]string{"a": "1", "b": "2"}},
		Spec: v1.PodSpec{SchedulerName: "gpusched", Containers: []v1.Container{{Name: "vllm", Image: "vllm/vllm-openai",
			Args:      []string{"serve", "meta-llama/Llama-3.1-8B-Instruct"},
			Resources: v1.ResourceRequirements{Limits: v1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}}}}},
	}
	for _, e := range edit {
		e(pod)
	}
	return pod
}

func TestSpecKeyIsOnePerSpecNotPerPod(t *testing.T) {
	base := mustKey(t, replica("a"))
	for _, tc := range []struct {
		name string
		edit func(*v1.Pod)
		same bool
	}{
		{"another replica", func(p *v1.Pod) { p.Name, p.UID = "b", "uid-b" }, true},
		{"owner and version", func(p *v1.Pod) {
			p.OwnerReferences = []metav1.OwnerReference{{Name: "rs"}}
			p.ResourceVersion = "42"
		}, true},
		{"annotations in another order", func(p *v1.Pod) { p.Annotations = map[string]string{"b": "2", "a": "1"} }, true},
		{"another namespace", func(p *v1.Pod) { p.Namespace = "other" }, false},
		{"an annotation", func(p *v1.Pod) { p.Annotations["gpusched.io/gpu-memory-per-gpu"] = "30Gi" }, false},
		{"a label", func(p *v1.Pod) { p.Labels["tier"] = "gold" }, false},
		{"an argument", func(p *v1.Pod) {
			p.Spec.Containers[0].Args = append(p.Spec.Containers[0].Args, "--tensor-parallel-size", "2")
		}, false},
		{"a resource", func(p *v1.Pod) {
			p.Spec.Containers[0].Resources.Limits["nvidia.com/gpu"] = resource.MustParse("2")
		}, false},
		{"a key moved into the value", func(p *v1.Pod) { p.Annotations = map[string]string{"a": "12", "": ""} }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := mustKey(t, replica("a", tc.edit)) == base; got != tc.same {
				t.Errorf("same key = %v, want %v", got, tc.same)
			}
		})
	}
}

func mustKey(t *testing.T, pod *v1.Pod) string {
	t.Helper()
	key, err := specKey(pod)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

// le32 encodes uint32s as the wire does (a Groups' ids, a reply's moves): little-endian, 4 bytes each.
func le32(values ...uint32) []byte {
	b := make([]byte, 4*len(values))
	for i, v := range values {
		binary.LittleEndian.PutUint32(b[4*i:], v)
	}
	return b
}

func groupsOf(grouping, gen uint64, ids ...uint32) *pb.Groups {
	return &pb.Groups{Grouping: grouping, TableGeneration: gen, Ids: le32(ids...)}
}

// answeredAs checks the cache's answer (reply, ok) against want (verdicts; nil: not answered, the
// core is asked); true when there is an answer to look into further.
func answeredAs(t *testing.T, reply *pb.PreFilterReply, ok bool, want []byte) bool {
	t.Helper()
	if ok != (want != nil) {
		t.Fatalf("answered = %v, want %v", ok, want != nil)
	}
	if ok && string(reply.GetVerdicts()) != string(want) {
		t.Errorf("verdicts %v, want %v", reply.GetVerdicts(), want)
	}
	return ok
}

// cacheable is a core's cacheable answer over nodes a, b, c, d: a and b of group 1 fit (score 70),
// c of group 2 is full, d of group 3 never fits.
func cacheable() *pb.PreFilterReply {
	r := vectors(7, nil, false,
		[]pb.Verdict{pb.Verdict_VERDICT_FITS, pb.Verdict_VERDICT_FITS, pb.Verdict_VERDICT_NOT_NOW, pb.Verdict_VERDICT_NEVER},
		[]string{"", "", "0 of 8 GPUs free", "node has 4 GPUs"}, []byte{70, 70, 0, 0})
	r.Cacheable, r.Groups = true, groupsOf(11, 7, 1, 1, 2, 3)
	return r
}

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func TestAnswerCacheAnswersOnlyWhatTheCoreSaidForThoseGroups(t *testing.T) {
	table := &nodeTable{generation: 7, names: []string{"a", "b", "c", "d"}}
	for _, tc := range []struct {
		name   string
		maxAge time.Duration
		setup  func(c *answerCache, clock *fakeClock) // after learning cacheable() for "spec"
		key    string
		table  *nodeTable
		want   []byte // verdicts; nil: not answered (the core is asked)
	}{
		{"the same groups answer as the core did", time.Second, nil, "spec", table, []byte{0, 0, 1, 2}},
		{"a node moved to a known group", time.Second, func(c *answerCache, _ *fakeClock) {
			c.renew(groupsOf(11, 7, 2, 1, 2, 3)) // a was reserved full
		}, "spec", table, []byte{1, 0, 1, 2}},
		{"a node in a group never answered for the spec", time.Second, func(c *answerCache, _ *fakeClock) {
			c.renew(groupsOf(11, 7, 9, 1, 2, 3))
		}, "spec", table, nil},
		{"another spec", time.Second, nil, "other", table, nil},
		{"groups older than the age", time.Second, func(_ *answerCache, clock *fakeClock) {
			clock.t = clock.t.Add(1500 * time.Millisecond)
		}, "spec", table, nil},
		{"another table", time.Second, nil, "spec", &nodeTable{generation: 8, names: table.names}, nil},
		{"a new grouping drops what was learned", time.Second, func(c *answerCache, _ *fakeClock) {
			c.renew(groupsOf(12, 7, 1, 1, 2, 3))
		}, "spec", table, nil},
		{"no node would fit: the core decides the pod waits", time.Second, func(c *answerCache, _ *fakeClock) {
			c.renew(groupsOf(11, 7, 2, 2, 2, 3))
		}, "spec", table, nil},
		{"a refused reservation forgets the groups", time.Second, func(c *answerCache, _ *fakeClock) {
			c.forget()
		}, "spec", table, nil},
		{"answerMaxAge 0: always ask", 0, nil, "spec", table, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := &fakeClock{t: time.Unix(1000, 0)}
			c := newAnswerCache(tc.maxAge, clock.now)
			c.learn("spec", cacheable())
			if tc.setup != nil {
				tc.setup(c, clock)
			}
			reply, ok := c.answer(tc.key, tc.table)
			if !answeredAs(t, reply, ok, tc.want) {
				return
			}
			for i, v := range tc.want { // reasons and scores travel with the verdict of the node's group
				reason := reply.GetReasons()[reply.GetReasonIndex()[i]]
				if (v == 0) != (reason == "" && reply.GetScores()[i] == 70) {
					t.Errorf("node %d: verdict %d with reason %q score %d", i, v, reason, reply.GetScores()[i])
				}
			}
		})
	}
}

func TestOnlyTheGroupsASpecLacksAreAskedFor(t *testing.T) {
	table := &nodeTable{generation: 7, names: []string{"a", "b", "c", "d"}}
	judged := func(ids []uint32, verdicts ...pb.Verdict) *pb.JudgeGroupsReply {
		r := &pb.JudgeGroupsReply{Grouping: 11, Ids: le32(ids...), Moves: make([]byte, 4*len(ids)),
			Scores: make([]byte, len(ids)), ReasonIndex: make([]uint32, len(ids)), Reasons: []string{""}}
		for _, v := range verdicts {
			r.Verdicts = append(r.Verdicts, byte(v))
		}
		return r
	}
	fits := pb.Verdict_VERDICT_FITS
	for _, tc := range []struct {
		name      string
		ids       []uint32 // renewed after learning cacheable() (groups 1 1 2 3) for "spec"
		key       string
		positions []uint32 // what unjudged asks for
		reply     *pb.JudgeGroupsReply
		want      []byte // verdicts answered once learned; nil: not answered (the whole cycle is asked)
	}{
		{"every group known: nothing to ask", []uint32{1, 1, 2, 3}, "spec", nil, nil, []byte{0, 0, 1, 2}},
		{"one node per new group", []uint32{9, 9, 2, 8}, "spec", []uint32{0, 3},
			judged([]uint32{9, 8}, fits, pb.Verdict_VERDICT_NEVER), []byte{0, 0, 1, 2}},
		{"another spec: the whole cycle", []uint32{9, 1, 2, 3}, "other", nil, nil, nil},
		{"not judged: the whole cycle", []uint32{9, 1, 2, 3}, "spec", []uint32{0},
			&pb.JudgeGroupsReply{NotJudged: "the node table is generation 8 now"}, nil},
		{"judged under another grouping: not kept", []uint32{9, 1, 2, 3}, "spec", []uint32{0},
			func() *pb.JudgeGroupsReply { r := judged([]uint32{9}, fits); r.Grouping = 12; return r }(), nil},
		{"not one answer per position: not kept", []uint32{9, 1, 2, 3}, "spec", []uint32{0},
			judged([]uint32{9, 1}, fits, fits), nil},
		{"judged in another group (it moved on meanwhile): its held one stays unknown", []uint32{9, 1, 2, 3}, "spec", []uint32{0},
			judged([]uint32{10}, fits), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newAnswerCache(time.Second, time.Now)
			c.learn("spec", cacheable())
			c.renew(groupsOf(11, 7, tc.ids...))
			positions := c.unjudged(tc.key, table)
			if !slices.Equal(positions, tc.positions) {
				t.Fatalf("unjudged = %v, want %v", positions, tc.positions)
			}
			if tc.reply != nil {
				c.learnJudged(tc.key, len(positions), tc.reply)
			}
			reply, ok := c.answer(tc.key, table)
			answeredAs(t, reply, ok, tc.want)
		})
	}
}

func TestAheadOfTheNextPodTheGroupsLackingAMoveAreAskedForOnce(t *testing.T) {
	table := &nodeTable{generation: 7, names: []string{"a", "b", "c", "d"}}
	c := newAnswerCache(time.Second, time.Now)
	c.learn("spec", cacheable()) // group 1 (a, b) fits and names no move
	c.noteSpec("spec", replica("r0"))
	if got := c.unjudged("spec", table); got != nil {
		t.Fatalf("in the cycle, unjudged = %v: every group has an answer", got)
	}
	jobs := c.toPrefetch(table)
	if len(jobs) != 1 || jobs[0].key != "spec" || !slices.Equal(jobs[0].positions, []uint32{0}) {
		t.Fatalf("toPrefetch = %+v, want spec's group 1 at a", jobs)
	}
	reply := &pb.JudgeGroupsReply{Grouping: 11, Ids: le32(1), Verdicts: []byte{0}, Scores: []byte{70},
		ReasonIndex: []uint32{0}, Reasons: []string{""}, Moves: le32(0)} // the core names none either
	if !c.learnJudged("spec", len(jobs[0].positions), reply) {
		t.Fatal("the judged answer was not kept")
	}
	if jobs := c.toPrefetch(table); len(jobs) != 0 {
		t.Fatalf("toPrefetch = %+v after the core judged the group: asked again", jobs)
	}
}

func TestARegroupingPastTheBoundAsksTheWholeCycle(t *testing.T) {
	for _, groups := range []int{maxJudgedGroups, maxJudgedGroups + 1} {
		names := make([]string, groups)
		ids := make([]uint32, groups)
		for i := range names {
			names[i], ids[i] = fmt.Sprintf("n%d", i), uint32(100+i)
		}
		c := newAnswerCache(time.Second, time.Now)
		r := cacheable()
		r.TableGeneration, r.Groups.TableGeneration = 8, 8
		c.learn("spec", r)
		c.renew(groupsOf(11, 8, ids...))
		got := len(c.unjudged("spec", &nodeTable{generation: 8, names: names}))
		if want := groups * btoi(groups <= maxJudgedGroups); got != want {
			t.Errorf("%d new groups: unjudged names %d positions, want %d", groups, got, want)
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestAGroupTelemetryMovedANodeIntoIsJudgedAloneNotTheWholeCycle(t *testing.T) {
	for _, tc := range []struct {
		name         string
		prefetchBusy bool       // a prefetch is in flight when the renewal arrives: none more is started
		wantSource   string     // how r1's PreFilter is answered
		wantJudging  [][]uint32 // the positions of each JudgeGroups
	}{
		// Ahead, the group of b is asked for too: its answer fits but names no move (this core names none).
		{"asked ahead, off the cycle, once the renewal shows it", false, "plugin", [][]uint32{{1, 2}}},
		{"asked in the cycle while a prefetch is busy", true, "judged", [][]uint32{{2}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &cachingCore{ids: []uint32{1, 1, 1, 2}}
			p, _ := startWith(t, f, time.Second, time.Second)
			ctx := context.Background()
			answers := func() float64 {
				n, _ := testutil.GetCounterMetricValue(answersTotal.WithLabelValues(tc.wantSource))
				return n
			}
			answers0 := answers()
			state := framework.NewCycleState()
			if _, st := p.PreFilter(ctx, state, replica("r0"), nil); !st.IsSuccess() {
				t.Fatalf("PreFilter(r0): %v", st)
			}
			f.mu.Lock()
			f.ids[2] = 9 // a foreign process left c: a group no answer of the spec named yet
			f.mu.Unlock()
			p.core.prefetching.Store(tc.prefetchBusy)
			if st := p.Reserve(ctx, state, replica("r0"), "a"); !st.IsSuccess() { // its reply carries the new groups
				t.Fatalf("Reserve(r0): %v", st)
			}
			for deadline := time.Now().Add(5 * time.Second); !tc.prefetchBusy && p.core.prefetching.Load(); {
				if time.Now().After(deadline) {
					t.Fatal("the prefetch never finished")
				}
				time.Sleep(time.Millisecond)
			}
			state = framework.NewCycleState()
			if _, st := p.PreFilter(ctx, state, replica("r1"), nil); !st.IsSuccess() {
				t.Fatalf("PreFilter(r1): %v", st)
			}
			for n, want := range map[string]bool{"a": false, "b": true, "c": true, "d": false} {
				if got := p.Filter(ctx, state, replica("r1"), nodeInfo(n)).IsSuccess(); got != want {
					t.Errorf("Filter(%s) fits = %v, want %v", n, got, want)
				}
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			if f.asked != 1 || !slices.EqualFunc(f.judging, tc.wantJudging, slices.Equal) {
				t.Fatalf("core asked %d PreFilters and JudgeGroups for %v; want 1 and %v", f.asked, f.judging, tc.wantJudging)
			}
			if n := answers() - answers0; n != 1 {
				t.Fatalf("answers counted %s: %v, want 1", tc.wantSource, n)
			}
		})
	}
}

func TestGroupIdsFarApartAnswerAsDenseOnes(t *testing.T) {
	table := &nodeTable{generation: 7, names: []string{"a", "b", "c", "d"}}
	for _, ids := range [][]uint32{{1, 1, 2, 3}, {1, 1, 1 << 30, 3}} { // a slice by id, then a map
		c := newAnswerCache(time.Second, time.Now)
		r := cacheable()
		r.Groups = groupsOf(11, 7, ids...)
		c.learn("spec", r)
		reply, ok := c.answer("spec", table)
		if answeredAs(t, reply, ok, []byte{0, 0, 1, 2}) && reasonOf(reply, 2) != "0 of 8 GPUs free" {
			t.Errorf("ids %v: c's reason %q", ids, reasonOf(reply, 2))
		}
	}
}

func TestAGroupAnsweredTwoWaysIsNotLearned(t *testing.T) {
	c := newAnswerCache(time.Second, time.Now)
	r := cacheable()
	r.Groups = groupsOf(11, 7, 1, 1, 1, 3) // c is in group 1 but answered NOT_NOW: not a cacheable answer
	c.learn("spec", r)
	if _, ok := c.answer("spec", &nodeTable{generation: 7, names: []string{"a", "b", "c", "d"}}); ok {
		t.Fatal("answered from a group whose nodes were answered differently")
	}
}

// cachingCore is a fake core over nodes a, b, c, d that answers cacheable PreFilters and reserves
// by the groups it names (group 2: full; a node, once reserved, joins it), counting what it was asked.
type cachingCore struct {
	fakeCore
	mu        sync.Mutex
	ids       []uint32
	asked     int
	judged    []bool     // answered_by_plugin of each Reserve
	refuseFor string     // Reserve refuses this node (the plugin's answer for it was stale)
	judging   [][]uint32 // positions of each JudgeGroups
}

// groupAnswerOf is the core's answer for a node of group gid: group 2 is full, every other fits.
func groupAnswerOf(gid uint32) (pb.Verdict, string, byte) {
	if gid == 2 {
		return pb.Verdict_VERDICT_NOT_NOW, "0 of 8 GPUs free", 0
	}
	return pb.Verdict_VERDICT_FITS, "", 50
}

func (c *cachingCore) answerNow() *pb.PreFilterReply {
	verdicts := make([]pb.Verdict, len(c.ids))
	reasons := make([]string, len(c.ids))
	scores := make([]byte, len(c.ids))
	for i, gid := range c.ids {
		verdicts[i], reasons[i], scores[i] = groupAnswerOf(gid)
	}
	r := vectors(7, []string{"a", "b", "c", "d"}, true, verdicts, reasons, scores)
	r.Cacheable = true
	r.Groups = groupsOf(11, 7, c.ids...)
	return r
}

func (c *cachingCore) PreFilter(_ context.Context, _ *pb.PreFilterRequest) (*pb.PreFilterReply, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.asked++
	return c.answerNow(), nil
}

func (c *cachingCore) JudgeGroups(_ context.Context, r *pb.JudgeGroupsRequest) (*pb.JudgeGroupsReply, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.judging = append(c.judging, r.GetPositions())
	reply := &pb.JudgeGroupsReply{Grouping: 11, Reasons: []string{""}, Moves: make([]byte, 4*len(r.GetPositions()))}
	for _, at := range r.GetPositions() {
		gid := c.ids[at]
		verdict, reason, score := groupAnswerOf(gid)
		reply.Ids = append(reply.Ids, le32(gid)...)
		reply.Verdicts, reply.Scores = append(reply.Verdicts, byte(verdict)), append(reply.Scores, score)
		reply.ReasonIndex = append(reply.ReasonIndex, uint32(len(reply.Reasons)))
		reply.Reasons = append(reply.Reasons, reason)
	}
	return reply, nil
}

func (c *cachingCore) Reserve(_ context.Context, r *pb.ReserveRequest) (*pb.ReserveReply, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.judged = append(c.judged, r.GetAnsweredByPlugin())
	if r.GetNode() == c.refuseFor {
		return &pb.ReserveReply{Reserved: false, Refusal: "node " + r.GetNode() + " no longer fits"}, nil
	}
	c.ids[strings.Index("abcd", r.GetNode())] = 2
	return &pb.ReserveReply{Reserved: true, Groups: groupsOf(11, 7, c.ids...)}, nil
}

func TestReplicasAreAnsweredByThePluginAndReservedByTheCore(t *testing.T) {
	f := &cachingCore{ids: []uint32{1, 1, 1, 2}} // d is full: the first answer teaches both groups
	p, _ := startWith(t, f, time.Second, time.Second)
	ctx := context.Background()
	cycle := func(name, node string) *fwk.Status {
		state := framework.NewCycleState()
		if _, st := p.PreFilter(ctx, state, replica(name), nil); !st.IsSuccess() {
			t.Fatalf("PreFilter(%s): %v", name, st)
		}
		for i, n := range []string{"a", "b", "c", "d"} {
			got := p.Filter(ctx, state, replica(name), nodeInfo(n)).IsSuccess()
			f.mu.Lock()
			want := f.ids[i] != 2
			f.mu.Unlock()
			if got != want {
				t.Errorf("%s: Filter(%s) fits = %v, the core would say %v", name, n, got, want)
			}
		}
		return p.Reserve(ctx, state, replica(name), node)
	}
	if st := cycle("r0", "a"); !st.IsSuccess() {
		t.Fatalf("Reserve r0: %v", st)
	}
	if st := cycle("r1", "b"); !st.IsSuccess() {
		t.Fatalf("Reserve r1: %v", st)
	}
	f.mu.Lock()
	asked, judged := f.asked, append([]bool(nil), f.judged...)
	f.mu.Unlock()
	if asked != 1 || len(judged) != 2 || judged[0] || !judged[1] {
		t.Fatalf("core asked %d PreFilters, Reserves answered_by_plugin %v; want 1, [false true]", asked, judged)
	}
	// The core's state moves on without this scheduler (c filled elsewhere): the plugin's answer
	// for c is stale, the core refuses, the pod is retried (Error) and the next cycle asks.
	f.mu.Lock()
	f.refuseFor = "c"
	f.mu.Unlock()
	st := cycle("r2", "c")
	if st.Code() != fwk.Error || !strings.Contains(st.Message(), "cached answer was stale") {
		t.Fatalf("Reserve on a stale answer: %v, want Error naming the stale cache", st)
	}
	f.mu.Lock()
	f.ids[2] = 2
	f.mu.Unlock()
	state := framework.NewCycleState()
	if _, st := p.PreFilter(ctx, state, replica("r3"), nil); st.Code() != fwk.Success {
		t.Fatalf("PreFilter r3: %v", st)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.asked != 2 {
		t.Errorf("after a refused cached answer the core was asked %d PreFilters in all, want 2", f.asked)
	}
}

func TestASkippedSpecIsSkippedWithoutAskingWhateverTheGroups(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	c := newAnswerCache(time.Second, clock.now)
	c.learn("cpu-only", &pb.PreFilterReply{Skip: true, Cacheable: true})
	c.learn("not-cacheable", &pb.PreFilterReply{Skip: true})
	clock.t = clock.t.Add(time.Hour) // no groups, none fresh: a skip needs neither
	if reply, ok := c.answer("cpu-only", nil); !ok || !reply.GetSkip() {
		t.Fatalf("answer(cpu-only) = %v %v, want a skip", reply, ok)
	}
	if _, ok := c.answer("not-cacheable", nil); ok {
		t.Fatal("a skip the core did not mark cacheable was answered from the cache")
	}
}

func TestTheAnswerAuditAsksTheCoreTooAndCountsWhereTheyDiffer(t *testing.T) {
	f := &cachingCore{ids: []uint32{1, 1, 1, 2}}
	p, _ := startAudited(t, f, time.Second, time.Second, true)
	ctx := context.Background()
	audits := func() (match, mismatch float64) {
		m, _ := testutil.GetCounterMetricValue(answerAuditsTotal.WithLabelValues("match"))
		mm, _ := testutil.GetCounterMetricValue(answerAuditsTotal.WithLabelValues("mismatch"))
		return m, mm
	}
	match0, mismatch0 := audits()
	preFilter := func(name string) {
		if _, st := p.PreFilter(ctx, framework.NewCycleState(), replica(name), nil); !st.IsSuccess() {
			t.Fatalf("PreFilter(%s): %v", name, st)
		}
	}
	preFilter("r0") // asked: the cache learns
	preFilter("r1") // the cache answers, and the audit asks: the same answer
	if m, mm := audits(); m-match0 != 1 || mm-mismatch0 != 0 {
		t.Fatalf("after one cached answer the core agrees with: match %v mismatch %v, want 1 0", m-match0, mm-mismatch0)
	}
	f.mu.Lock()
	f.ids[2] = 2 // node c fills without this scheduler: the cache still says it fits
	asked := f.asked
	f.mu.Unlock()
	preFilter("r2")
	if m, mm := audits(); m-match0 != 1 || mm-mismatch0 != 1 {
		t.Fatalf("after a stale cached answer: match %v mismatch %v, want 1 1", m-match0, mm-mismatch0)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.asked != asked+1 {
		t.Fatalf("the audit asked the core %d times for one cached answer, want 1", f.asked-asked)
	}
}
