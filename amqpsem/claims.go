package amqpsem

import (
	amqp "github.com/rabbitmq/amqp091-go"
)

// A slot is claimed by an exclusive consumer on its claim queue
// (claimQueue): the broker refuses a second exclusive consumer while the
// first exists and drops it when its channel or connection closes. reserve
// keeps two callers of this process from trying for one slot at once.

// claimTag is the consumer tag of a slot claim on its holder's channel.
const claimTag = "tokensem-claim"

// claimSlot starts the exclusive consumer that claims a slot, declaring the
// slot's claim queue the first time this process meets it.
func (s *Semaphore) claimSlot(pc *pooledChannel, index int) error {
	q := claimQueue(s.name, index)
	if !s.knownClaim(index) {
		if _, err := pc.ch.QueueDeclare(q, false, false, false, false, nil); err != nil {
			return err
		}
		s.markClaim(index)
	}
	_, err := pc.ch.Consume(q, claimTag, false, true, false, false, nil)
	if isCode(err, amqp.NotFound) { // deleted behind our back (a broker restart)
		s.forgetClaim(index)
	}
	return err
}

func (s *Semaphore) reserve(index int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held[index] {
		return false
	}
	s.held[index] = true
	return true
}

func (s *Semaphore) unreserve(index int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.held, index)
}

func (s *Semaphore) knownClaim(index int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.claims[index]
}

func (s *Semaphore) markClaim(index int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.claims[index] = true
}

func (s *Semaphore) forgetClaim(index int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.claims, index)
}
