package gpusched

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	pb "github.com/gpusched/gpusched/scheduler-plugin/gen/scheduling/v1"
)

// withMoves is a core's cacheable answer over nodes a, b, c, d in groups 1, 4, 2, 3 under ledger
// version 5: group 1 fits (score 70) and moves to 4 once reserved on; group 4 fits (score 80) and
// moves to 2; group 2 is full; group 3 never fits.
func withMoves() *pb.PreFilterReply {
	r := vectors(7, nil, false,
		[]pb.Verdict{pb.Verdict_VERDICT_FITS, pb.Verdict_VERDICT_FITS, pb.Verdict_VERDICT_NOT_NOW, pb.Verdict_VERDICT_NEVER},
		[]string{"", "", "0 of 8 GPUs free", "node has 4 GPUs"}, []byte{70, 80, 0, 0})
	r.Cacheable, r.Groups, r.Moves = true, groupsOf(11, 7, 1, 4, 2, 3), le32(4, 2, 0, 0)
	r.Groups.LedgerVersion = 5
	return r
}

func versioned(g *pb.Groups, version uint64) *pb.Groups {
	g.LedgerVersion = version
	return g
}

func TestAnAssumedNodeIsJudgedByItsMoveUntilTheCoreConfirms(t *testing.T) {
	table := &nodeTable{generation: 7, names: []string{"a", "b", "c", "d"},
		index: map[string]int{"a": 0, "b": 1, "c": 2, "d": 3}}
	notNow, never := byte(pb.Verdict_VERDICT_NOT_NOW), byte(pb.Verdict_VERDICT_NEVER)
	for _, tc := range []struct {
		name    string
		steps   func(t *testing.T, c *answerCache) // after learning withMoves() for "spec"
		want    []byte                             // verdicts; nil: not answered (the core is asked)
		reasonA string                             // node a's reason, where it is not "fits"
	}{
		{"nothing assumed", nil, []byte{0, 0, notNow, never}, ""},
		{"a reserved: judged in group 4", func(t *testing.T, c *answerCache) {
			mustAssume(t, c, "a")
		}, []byte{0, 0, notNow, never}, ""},
		{"a reserved twice: judged in group 2", func(t *testing.T, c *answerCache) {
			mustAssume(t, c, "a")
			mustAssume(t, c, "a")
		}, []byte{notNow, 0, notNow, never}, "0 of 8 GPUs free"},
		{"the first of two confirmed: still judged by the second's move", func(t *testing.T, c *answerCache) {
			mustAssume(t, c, "a")
			mustAssume(t, c, "a")
			c.settle(versioned(groupsOf(11, 7, 4, 4, 2, 3), 6), []string{"a"}, []bool{true})
		}, []byte{notNow, 0, notNow, never}, "0 of 8 GPUs free"},
		{"both confirmed: judged by the core's groups", func(t *testing.T, c *answerCache) {
			mustAssume(t, c, "a")
			c.settle(versioned(groupsOf(11, 7, 2, 4, 2, 3), 6), []string{"a"}, []bool{true})
		}, []byte{notNow, 0, notNow, never}, "0 of 8 GPUs free"},
		{"a move into a group never answered for the spec: not now", func(t *testing.T, c *answerCache) {
			r := withMoves()
			r.Moves = le32(9, 2, 0, 0)
			c.learn("spec", r)
			mustAssume(t, c, "a")
		}, []byte{notNow, 0, notNow, never}, confirmingReason},
		{"a refused confirmation: the core is asked", func(t *testing.T, c *answerCache) {
			mustAssume(t, c, "a")
			c.settle(nil, []string{"a"}, []bool{false})
		}, nil, ""},
		{"groups of an older ledger arriving late are not taken", func(t *testing.T, c *answerCache) {
			c.renew(versioned(groupsOf(11, 7, 2, 4, 2, 3), 4))
		}, []byte{0, 0, notNow, never}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newAnswerCache(time.Second, time.Now)
			c.learn("spec", withMoves())
			if tc.steps != nil {
				tc.steps(t, c)
			}
			reply, ok := c.answer("spec", table)
			if !answeredAs(t, reply, ok, tc.want) {
				return
			}
			if got := reasonOf(reply, 0); got != tc.reasonA {
				t.Errorf("node a's reason %q, want %q", got, tc.reasonA)
			}
		})
	}
}

func mustAssume(t *testing.T, c *answerCache, node string) {
	t.Helper()
	table := &nodeTable{generation: 7, names: []string{"a", "b", "c", "d"}, index: map[string]int{"a": 0, "b": 1, "c": 2, "d": 3}}
	if !c.assume("spec", table, node) {
		t.Fatalf("assume(%s) refused", node)
	}
}

func TestAnAssumedNodeThatDoesNotFitKeepsItsReason(t *testing.T) {
	table := &nodeTable{generation: 7, names: []string{"a", "b", "c", "d"}, index: map[string]int{"a": 0, "b": 1, "c": 2, "d": 3}}
	c := newAnswerCache(time.Second, time.Now)
	r := withMoves()
	r.Moves = le32(9, 2, 0, 0) // a moves into a group never answered for the spec
	c.learn("spec", r)
	mustAssume(t, c, "a")
	for _, tc := range []struct {
		name    string
		verdict pb.Verdict
		reason  string
		want    string
	}{
		{"the core has it fitting: not now until confirmed", pb.Verdict_VERDICT_FITS, "", confirmingReason},
		{"the core has it full: its own reason", pb.Verdict_VERDICT_NOT_NOW, "0 of 8 GPUs free", "0 of 8 GPUs free"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			asked := vectors(7, nil, false, []pb.Verdict{tc.verdict, pb.Verdict_VERDICT_FITS, pb.Verdict_VERDICT_NOT_NOW,
				pb.Verdict_VERDICT_NEVER}, []string{tc.reason, "", "0 of 8 GPUs free", "node has 4 GPUs"}, []byte{0, 80, 0, 0})
			c.overlay("spec", asked, table)
			if got := reasonOf(asked, 0); got != tc.want || asked.GetVerdicts()[0] != byte(pb.Verdict_VERDICT_NOT_NOW) {
				t.Errorf("node a: verdict %d %q, want not now %q", asked.GetVerdicts()[0], got, tc.want)
			}
		})
	}
}

func TestOnlyANodeWhoseAnswerFitsAndNamesAMoveIsAssumed(t *testing.T) {
	table := &nodeTable{generation: 7, names: []string{"a", "b", "c", "d"}, index: map[string]int{"a": 0, "b": 1, "c": 2, "d": 3}}
	c := newAnswerCache(time.Second, time.Now)
	c.learn("spec", withMoves())
	for node, want := range map[string]bool{"a": true, "c": false, "d": false, "nowhere": false} {
		if got := c.assume("spec", table, node); got != want {
			t.Errorf("assume(%s) = %v, want %v", node, got, want)
		}
	}
	if c.assume("other-spec", table, "b") {
		t.Error("assumed on the answer of a spec never learned")
	}
	if c.assume("spec", &nodeTable{generation: 8, names: table.names, index: table.index}, "b") {
		t.Error("assumed over another table")
	}
	c.reservedByCore("a") // the core reserved on a itself: a's assumed group is unknown now
	if c.assume("spec", table, "a") {
		t.Error("assumed on a node whose group became unknown")
	}
	// A new grouping: what a core's answer says of an assumed node is overlaid "not now".
	r := withMoves()
	r.Groups = versioned(groupsOf(12, 7, 1, 4, 2, 3), 9)
	c.learn("spec", r)
	c.overlay("spec", r, table)
	if r.GetVerdicts()[0] != byte(pb.Verdict_VERDICT_NOT_NOW) || reasonOf(r, 0) != confirmingReason {
		t.Errorf("node a in the core's answer after a new grouping: verdict %d %q, want not now (%q)",
			r.GetVerdicts()[0], reasonOf(r, 0), confirmingReason)
	}
}

// batchingCore is a fake core over nodes a, b, ... (one per id; group 1: free, moves to 2: full) that answers
// cacheable PreFilters with moves and confirms ReserveBatch by those groups. Each ReserveBatch
// says it arrived (on arrived, when set) and waits for gate (when set) before answering; refuse
// names a node it refuses.
type batchingCore struct {
	fakeCore
	mu       sync.Mutex
	ids      []uint32
	version  uint64
	asked    int
	reserves int        // Reserve calls (the core reserving in the cycle)
	batches  [][]string // pod names of each ReserveBatch
	refuse   string
	arrived  chan struct{}
	gate     chan struct{}
	move     uint32 // the group a fitting node moves to (0: 2, full)
}

func (c *batchingCore) PreFilter(_ context.Context, _ *pb.PreFilterRequest) (*pb.PreFilterReply, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.asked++
	n := len(c.ids)
	verdicts, reasons, scores, moves := make([]pb.Verdict, n), make([]string, n), make([]byte, n), make([]uint32, n)
	for i, gid := range c.ids {
		if gid == 2 {
			verdicts[i], reasons[i] = pb.Verdict_VERDICT_NOT_NOW, "0 of 8 GPUs free"
		} else {
			scores[i], moves[i] = 50, max(c.move, 2)
		}
	}
	r := vectors(7, strings.Split("abcde"[:n], ""), true, verdicts, reasons, scores)
	r.Cacheable, r.Groups, r.Moves = true, versioned(groupsOf(11, 7, c.ids...), c.version), le32(moves...)
	return r, nil
}

func (c *batchingCore) Reserve(_ context.Context, r *pb.ReserveRequest) (*pb.ReserveReply, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reserves++
	c.ids[strings.Index("abcde", r.GetNode())] = 2
	c.version++
	return &pb.ReserveReply{Reserved: true, Groups: versioned(groupsOf(11, 7, c.ids...), c.version)}, nil
}

func (c *batchingCore) ReserveBatch(_ context.Context, r *pb.ReserveBatchRequest) (*pb.ReserveBatchReply, error) {
	if c.arrived != nil {
		c.arrived <- struct{}{}
	}
	if c.gate != nil {
		<-c.gate
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	reply := &pb.ReserveBatchReply{}
	var names []string
	for _, res := range r.GetReservations() {
		names = append(names, res.GetPod().GetName())
		at := strings.Index("abcde", res.GetNode())
		if res.GetNode() == c.refuse || !res.GetAnsweredByPlugin() || c.ids[at] == 2 {
			reply.Replies = append(reply.Replies, &pb.ReserveReply{Refusal: "node " + res.GetNode() + " no longer fits"})
			continue
		}
		c.ids[at] = 2
		c.version++
		reply.Replies = append(reply.Replies, &pb.ReserveReply{Reserved: true,
			Annotations: map[string]string{"gpusched.io/assigned-gpus": "GPU-" + res.GetNode()}})
	}
	c.batches = append(c.batches, names)
	reply.Groups = versioned(groupsOf(11, 7, c.ids...), c.version)
	return reply, nil
}

// scheduleCycle runs one scheduling cycle of name up to Reserve on node, checking every Filter
// against want (fits per node a, b, ...).
func scheduleCycle(t *testing.T, p *Plugin, name, node string, want []bool) fwk.CycleState {
	t.Helper()
	ctx := context.Background()
	state := framework.NewCycleState()
	if _, st := p.PreFilter(ctx, state, replica(name), nil); !st.IsSuccess() {
		t.Fatalf("PreFilter(%s): %v", name, st)
	}
	for i, n := range strings.Split("abcde"[:len(want)], "") {
		if got := p.Filter(ctx, state, replica(name), nodeInfo(n)).IsSuccess(); got != want[i] {
			t.Errorf("%s: Filter(%s) fits = %v, want %v", name, n, got, want[i])
		}
	}
	if st := p.Reserve(ctx, state, replica(name), node); !st.IsSuccess() {
		t.Fatalf("Reserve(%s on %s): %v", name, node, st)
	}
	return state
}

func TestReservationsThePluginTookAreConfirmedInBatchesBeforeBind(t *testing.T) {
	f := &batchingCore{ids: []uint32{1, 1, 1, 1, 2}, version: 1, // e full: the first answer teaches both groups
		arrived: make(chan struct{}, 8), gate: make(chan struct{})}
	p, cs := startWith(t, f, 5*time.Second, time.Second)
	made := recordBindings(cs)
	ctx := context.Background()
	// r0 asks the core, which reserves it in the cycle; the rest are answered and reserved by the
	// plugin: each node reserved on reads full at once, though the core has confirmed nothing yet
	// (its first batch, r1's, waits at the gate while r2's and r3's queue).
	scheduleCycle(t, p, "r0", "a", []bool{true, true, true, true, false})
	states := map[string]fwk.CycleState{"r1": scheduleCycle(t, p, "r1", "b", []bool{false, true, true, true, false})}
	<-f.arrived
	states["r2"] = scheduleCycle(t, p, "r2", "c", []bool{false, false, true, true, false})
	states["r3"] = scheduleCycle(t, p, "r3", "d", []bool{false, false, false, true, false})
	close(f.gate)
	for name, state := range states {
		node := map[string]string{"r1": "b", "r2": "c", "r3": "d"}[name]
		if st := p.Bind(ctx, state, replica(name), node); !st.IsSuccess() {
			t.Fatalf("Bind(%s): %v", name, st)
		}
		if b := made.of(name); b == nil || b.Annotations["gpusched.io/assigned-gpus"] != "GPU-"+node {
			t.Errorf("Binding of %s: %+v, want the core's confirmation's annotations", name, b)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.asked != 1 || f.reserves != 1 {
		t.Errorf("the core was asked %d PreFilters and %d Reserves; want 1 and 1", f.asked, f.reserves)
	}
	if len(f.batches) != 2 || len(f.batches[0]) != 1 || len(f.batches[1]) != 2 {
		t.Errorf("batches %v, want [[r1] [r2 r3]]: what queued while one was sent goes in the next", f.batches)
	}
}

func TestARefusedConfirmationFailsBindAndTheNextCycleAsksTheCore(t *testing.T) {
	f := &batchingCore{ids: []uint32{1, 1, 1, 2}, version: 1, refuse: "b"}
	p, cs := startWith(t, f, 5*time.Second, time.Second)
	made := recordBindings(cs)
	ctx := context.Background()
	scheduleCycle(t, p, "r0", "a", []bool{true, true, true, false}) // asked and reserved by the core
	s1 := scheduleCycle(t, p, "r1", "b", []bool{false, true, true, false})
	st := p.Bind(ctx, s1, replica("r1"), "b")
	if st.Code() != fwk.Error || !strings.Contains(st.Message(), "node b no longer fits") ||
		!strings.Contains(st.Message(), "the core refused") {
		t.Fatalf("Bind of a refused confirmation: %v, want Error with the core's refusal", st)
	}
	if made.of("r1") != nil {
		t.Error("a pod whose reservation the core refused was bound")
	}
	p.Unreserve(ctx, s1, replica("r1"), "b")
	state := framework.NewCycleState()
	if _, st := p.PreFilter(ctx, state, replica("r1"), nil); !st.IsSuccess() {
		t.Fatalf("PreFilter(r1) again: %v", st)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.unreserved) != 0 {
		t.Errorf("Unreserve of a refused reservation reached the core (%v): it holds nothing", f.unreserved)
	}
	if f.asked != 2 {
		t.Errorf("the core was asked %d PreFilters, want 2: the refused pod's next cycle asks", f.asked)
	}
}

func TestAReservationUnreservedBeforeItWasSentNeverReachesTheCore(t *testing.T) {
	f := &batchingCore{ids: []uint32{1, 1, 1, 2}, version: 1, arrived: make(chan struct{}, 8), gate: make(chan struct{})}
	p, cs := startWith(t, f, 5*time.Second, time.Second)
	recordBindings(cs)
	ctx := context.Background()
	scheduleCycle(t, p, "r0", "a", []bool{true, true, true, false})        // asked and reserved by the core
	s1 := scheduleCycle(t, p, "r1", "b", []bool{false, true, true, false}) // its batch waits at the gate
	<-f.arrived
	s2 := scheduleCycle(t, p, "r2", "c", []bool{false, false, true, false}) // queued behind it
	p.Unreserve(ctx, s2, replica("r2"), "c")
	close(f.gate)
	if st := p.Bind(ctx, s1, replica("r1"), "b"); !st.IsSuccess() {
		t.Fatalf("Bind(r1): %v", st)
	}
	// c is judged by the core's groups again: free.
	scheduleCycle(t, p, "r3", "c", []bool{false, false, true, false})
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, batch := range f.batches {
		for _, name := range batch {
			if name == "r2" {
				t.Errorf("batches %v: the withdrawn r2 was sent", f.batches)
			}
		}
	}
	if len(f.unreserved) != 0 {
		t.Errorf("Unreserve of a withdrawn reservation reached the core (%v)", f.unreserved)
	}
}

func TestTheReservationsOfALingerGoInOneBatch(t *testing.T) {
	f := &batchingCore{ids: []uint32{1, 1, 1, 1, 2}, version: 1}
	p, cs := startLingering(t, f, 5*time.Second, time.Second, 300*time.Millisecond, false)
	recordBindings(cs)
	scheduleCycle(t, p, "r0", "a", []bool{true, true, true, true, false}) // asked and reserved by the core
	s1 := scheduleCycle(t, p, "r1", "b", []bool{false, true, true, true, false})
	s2 := scheduleCycle(t, p, "r2", "c", []bool{false, false, true, true, false})
	for name, state := range map[string]fwk.CycleState{"r1": s1, "r2": s2} {
		if st := p.Bind(context.Background(), state, replica(name), map[string]string{"r1": "b", "r2": "c"}[name]); !st.IsSuccess() {
			t.Fatalf("Bind(%s): %v", name, st)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.batches) != 1 || len(f.batches[0]) != 2 {
		t.Errorf("batches %v, want [[r1 r2]]: reservations taken within the linger are confirmed together", f.batches)
	}
}

// nextCore is batchingCore over nodes a, b, c, d whose fitting group 1 (8 GPUs free) moves to 3 (7
// free), which fits and moves to 2 (full, as d is: the first answer teaches groups 1 and 2).
// Reserve fills a node (batchingCore's); ReserveBatch moves each node to 3 and names, in each
// reply's next, the answer for group 3, which no PreFilter named.
type nextCore struct {
	batchingCore
	judging int    // JudgeGroups calls
	wants   []bool // want_next of each reservation batched
}

func (c *nextCore) JudgeGroups(_ context.Context, _ *pb.JudgeGroupsRequest) (*pb.JudgeGroupsReply, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.judging++
	return &pb.JudgeGroupsReply{NotJudged: "this fake judges nothing"}, nil
}

func (c *nextCore) ReserveBatch(_ context.Context, r *pb.ReserveBatchRequest) (*pb.ReserveBatchReply, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	reply := &pb.ReserveBatchReply{}
	for _, res := range r.GetReservations() {
		c.wants = append(c.wants, res.GetWantNext())
		c.ids[strings.Index("abcd", res.GetNode())] = 3
		c.version++
		reply.Replies = append(reply.Replies, &pb.ReserveReply{Reserved: true, Next: &pb.JudgeGroupsReply{Grouping: 11,
			Ids: le32(3), Verdicts: []byte{0}, Scores: []byte{40}, ReasonIndex: []uint32{0}, Reasons: []string{""},
			Moves: le32(2)}})
	}
	reply.Groups = versioned(groupsOf(11, 7, c.ids...), c.version)
	return reply, nil
}

func TestAConfirmedNodesNextAnswerComesWithItsConfirmation(t *testing.T) {
	f := &nextCore{batchingCore: batchingCore{ids: []uint32{1, 1, 1, 2}, version: 1, move: 3}}
	p, _ := startLingering(t, f, 5*time.Second, time.Second, 0, false)
	scheduleCycle(t, p, "r0", "a", []bool{true, true, true})  // asked: reserved by the core (a full)
	scheduleCycle(t, p, "r1", "b", []bool{false, true, true}) // answered and reserved by the plugin
	for deadline := time.Now().Add(5 * time.Second); len(p.core.answers.assumedNodes()) > 0; {
		if time.Now().After(deadline) {
			t.Fatal("the core never confirmed r1's reservation")
		}
		time.Sleep(time.Millisecond)
	}
	// b is in group 3 now, which only the confirmation's next answered: judged without asking.
	scheduleCycle(t, p, "r2", "b", []bool{false, true, true, false})
	for deadline := time.Now().Add(5 * time.Second); len(p.core.answers.assumedNodes()) > 0; {
		if time.Now().After(deadline) {
			t.Fatal("the core never confirmed r2's reservation")
		}
		time.Sleep(time.Millisecond)
	}
	f.mu.Lock()
	// r1's move (group 3) was unknown: its next asked for; r2's (group 2, full) was known.
	if !slices.Equal(f.wants, []bool{true, false}) {
		t.Errorf("want_next of the reservations batched: %v, want [true false]", f.wants)
	}
	defer f.mu.Unlock()
	if f.judging != 0 {
		t.Fatalf("JudgeGroups asked %d times; the confirmation named group 3's answer", f.judging)
	}
	if _, ok := p.core.answers.specs[mustKey(t, replica("r2"))][3]; !ok {
		t.Fatal("group 3's answer was not kept")
	}
}
