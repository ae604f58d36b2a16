package gpusched

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"

	pb "github.com/gpusched/gpusched/scheduler-plugin/gen/scheduling/v1"
)

// maxReserveBatch is the most reservations one ReserveBatch carries (the core refuses more).
const maxReserveBatch = 256

// errWithdrawn is a confirmation's outcome when Unreserve took it back before it was sent.
var errWithdrawn = errors.New("the reservation was withdrawn before the core was asked to confirm it")

// confirmation is one reservation the plugin took itself (answerCache.assume), on its way to the
// core. done closes once reply or err is set; sent (under confirmer.mu) once it left the queue.
type confirmation struct {
	pod   *v1.Pod
	key   string // the pod's spec key (the answers its cycle was answered from)
	node  string
	done  chan struct{}
	reply *pb.ReserveReply
	err   error
	sent  bool
}

// confirmer sends the plugin's own reservations to the core in batches, off the scheduling cycle
// (issue 43): Reserve queues one and returns; one sender at a time takes everything queued (at
// most maxReserveBatch) into one ReserveBatch, and whatever queued meanwhile goes in the next. So
// a burst is confirmed many pods per call, a lone pod at once, and nothing waits on a timer. Bind
// waits for its pod's confirmation; Unreserve withdraws one not sent yet.
type confirmer struct {
	send   func([]*confirmation) // one batch: sets each reply or err, then closes each done
	linger time.Duration         // how long a sender waits for more before taking the queue

	mu      sync.Mutex
	queue   []*confirmation
	sending bool
}

// later queues pod's reservation on node (pod answered from key's answers) and returns its confirmation.
func (q *confirmer) later(pod *v1.Pod, key, node string) *confirmation {
	conf := &confirmation{pod: pod, key: key, node: node, done: make(chan struct{})}
	q.mu.Lock()
	q.queue = append(q.queue, conf)
	start := !q.sending
	q.sending = true
	q.mu.Unlock()
	if start {
		go q.drain()
	}
	return conf
}

func (q *confirmer) drain() {
	for {
		if q.linger > 0 {
			time.Sleep(q.linger)
		}
		q.mu.Lock()
		n := min(len(q.queue), maxReserveBatch)
		if n == 0 {
			q.sending = false
			q.mu.Unlock()
			return
		}
		batch := make([]*confirmation, n)
		copy(batch, q.queue)
		q.queue = append(q.queue[:0], q.queue[n:]...)
		for _, conf := range batch {
			conf.sent = true
		}
		q.mu.Unlock()
		q.send(batch)
	}
}

// withdraw takes conf out of the queue if it was not sent: true when so (the core never hears of
// it, and conf ends with errWithdrawn).
func (q *confirmer) withdraw(conf *confirmation) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if conf.sent {
		return false
	}
	for i, queued := range q.queue {
		if queued == conf {
			q.queue = append(q.queue[:i], q.queue[i+1:]...)
			break
		}
	}
	conf.sent, conf.err = true, errWithdrawn
	close(conf.done)
	return true
}

// withdraw takes the plugin's reservation conf back if it was not sent to the core yet: true when
// so (the core never hears of it; its node is judged without it again).
func (c *core) withdraw(conf *confirmation) bool {
	if !c.confirms.withdraw(conf) {
		return false
	}
	c.answers.withdrawn(conf.node)
	return true
}

// confirmBatch asks the core to reserve batch (ReserveBatch) and settles the answer cache's assumed
// nodes with its answer: each reply, or the call's error for all of them.
func (c *core) confirmBatch(batch []*confirmation) {
	req := &pb.ReserveBatchRequest{ApiVersion: APIVersion, Reservations: make([]*pb.ReserveRequest, 0, len(batch))}
	asked := make([]*confirmation, 0, len(batch))
	nodes, reserved := make([]string, len(batch)), make([]bool, len(batch))
	for i, conf := range batch {
		nodes[i] = conf.node
		wire, err := wirePod(conf.pod)
		if err != nil {
			conf.err = err
			continue
		}
		req.Reservations = append(req.Reservations, &pb.ReserveRequest{ApiVersion: APIVersion, Pod: wire, Node: conf.node,
			AnsweredByPlugin: true, WantNext: !c.answers.knowsMove(conf.key, conf.node)})
		asked = append(asked, conf)
	}
	var reply *pb.ReserveBatchReply
	var err error
	if len(asked) > 0 {
		reply, err = call(context.Background(), c, func(ctx context.Context) (*pb.ReserveBatchReply, error) {
			return c.client.ReserveBatch(ctx, req)
		})
		if err == nil && len(reply.GetReplies()) != len(asked) {
			err = fmt.Errorf("gpusched core at %s answered %d reservations of %d", c.address, len(reply.GetReplies()), len(asked))
		}
		confirmBatchSize.Observe(float64(len(asked)))
	}
	for i, conf := range asked {
		if err != nil {
			conf.err = err
		} else {
			conf.reply = reply.GetReplies()[i]
		}
	}
	for i, conf := range batch {
		reserved[i] = conf.err == nil && conf.reply.GetReserved()
	}
	for _, conf := range asked { // before the groups that move the nodes there are taken
		if next := conf.reply.GetNext(); conf.reply.GetReserved() && next != nil {
			c.answers.learnJudged(conf.key, 1, next)
		}
	}
	c.answers.settle(reply.GetGroups(), nodes, reserved)
	for _, conf := range batch {
		close(conf.done)
	}
	c.prefetch()
}

// confirmed waits for conf and returns the annotations Bind writes, or why the pod cannot be bound
// (it is then unreserved and retried: kube-scheduler's handling of a failed binding cycle).
func (c *core) confirmed(ctx context.Context, conf *confirmation) (map[string]string, error) {
	select {
	case <-conf.done:
	case <-ctx.Done():
		return nil, fmt.Errorf("gpusched: waiting for the core to confirm the reservation on %s: %w", conf.node, ctx.Err())
	}
	switch {
	case conf.err != nil:
		return nil, fmt.Errorf("gpusched could not confirm the reservation on %s: %w", conf.node, conf.err)
	case !conf.reply.GetReserved():
		c.answers.askFor(conf.pod.UID)
		return nil, fmt.Errorf("%s (the plugin reserved on its cached answer, the core refused; the pod is retried)",
			orDefault(conf.reply.GetRefusal(), "gpusched refused the reservation"))
	case conf.reply.GetBarrier() != nil: // a gang member or DRA pod is never answered from the cache
		c.answers.askFor(conf.pod.UID)
		return nil, fmt.Errorf("gpusched confirmed the reservation on %s with a barrier (gang %s) the plugin did not wait at; "+
			"the pod is retried through the core", conf.node, conf.reply.GetBarrier().GetGang())
	}
	return conf.reply.GetAnnotations(), nil
}
