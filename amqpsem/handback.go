package amqpsem

// giveBack ends the slot's claim, then requeues the token (to the back of
// the queue, behind the waiters already served). The claim goes first: a
// waiter that received the token while the claim still existed would take
// it for a duplicate. Neither waits for the broker: it runs a channel's
// commands in order, and a cancel on a classic queue is a call into the
// queue's process, over before the channel reads the requeue. A round trip
// after them (basic.qos, which the pooled channel has already) confirms
// that the broker has both, so that a holder cut off from the broker
// learns that it lost its permit; the next holder's token is on its way
// meanwhile. The channel, now idle, goes back to the pool.
func (p *Permit) giveBack() error {
	err := p.pc.ch.Cancel(claimTag, true)
	if err == nil {
		err = p.pc.ch.Reject(p.tag, true)
	}
	if err == nil {
		err = p.pc.ch.Qos(1, 0, false)
	}
	if err != nil {
		_ = p.pc.ch.Close()
		return err
	}
	p.s.putChannel(p.pc)
	return nil
}
