package natssem

import (
	"context"
	"errors"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// upgradeClasses makes a semaphore whose token consumer serves waiters in
// arrival order only (made on a server before 2.12: cfg.PriorityGroup is
// empty) serve them by class, now that the server it is reached through
// can: Init runs it on a ready semaphore. It returns the configuration it
// wrote, or ok false when it changed nothing (the server is older, the
// semaphore serves classes already or is not ready, another admin's work
// came first, or a step failed: then it logs why, and Init still
// succeeds, serving arrival order as before).
//
// The order makes every client's pull valid throughout. First the
// configuration names the priority group, under the admin lock: a plain
// consumer takes pulls that name a group and a priority, and ignores both.
// Then the consumer is updated in place to the prioritized policy (its
// delivered, unacknowledged tokens stay with their holders, with their
// leases): from then a pull without the group is refused with 400, and a
// client that sends one reads the configuration again and asks again,
// with the group (acquisition.answer). If the server drops the policy (a
// cluster with an older server), the configuration is written back
// without the group.
func (s *Semaphore) upgradeClasses(ctx context.Context, cfg config) (_ config, ok bool) {
	if cfg.PriorityGroup != "" || cfg.State != stateReady || !serverAtLeast(s.nc.ConnectedServerVersion(), 2, 12) {
		return cfg, false
	}
	h, err := s.takeLock(ctx)
	if err != nil {
		s.log.Warn("serving priority classes: the admin lock", "err", err)
		return cfg, false
	}
	defer h.unlock()
	cur, rev, err := h.readConfig(ctx)
	if err != nil || cur.PriorityGroup != "" || cur.State != stateReady {
		return cfg, false
	}
	up := cur
	up.PriorityGroup = priorityGroup
	if rev, err = s.updateConfig(ctx, up, rev); err != nil {
		s.log.Warn("serving priority classes: the configuration", "err", err)
		return cfg, false
	}
	if err := s.prioritizeConsumer(ctx); err != nil {
		s.log.Warn("serving priority classes: the token consumer; waiters stay in arrival order", "err", err)
		if _, err := s.updateConfig(ctx, cur, rev); err != nil {
			// Pulls naming the group stay valid on a plain consumer:
			// classes are asked for and not served, as on a server
			// before 2.12 that dropped the policy unread.
			s.log.Warn("serving priority classes: writing the configuration back", "err", err)
		}
		return cfg, false
	}
	if err := s.announceConfig(ctx); err != nil {
		// Clients of a group learn of it within configTTL, or at their
		// first pull's 400.
		s.log.Warn("serving priority classes: announcing the configuration", "err", err)
	}
	s.log.Info("the token consumer now serves waiters by priority class")
	return up, true
}

// updateConfig writes cfg over the configuration at rev, returning the
// new revision.
func (s *Semaphore) updateConfig(ctx context.Context, cfg config, rev uint64) (uint64, error) {
	rctx, cancel := s.rtt(ctx)
	defer cancel()
	nrev, err := s.kv.Update(rctx, s.lay.key(configKey), cfg.encode(), rev)
	if err != nil {
		return 0, wrapBrokerErr(err)
	}
	return nrev, nil
}

// prioritizeConsumer updates the token consumer in place to serve pulls
// by class, and checks that the server kept the policy.
func (s *Semaphore) prioritizeConsumer(ctx context.Context) error {
	rctx, cancel := s.rtt(ctx)
	defer cancel()
	c, err := s.js.Consumer(rctx, s.lay.stream, s.lay.consumer)
	if err != nil {
		return wrapBrokerErr(err)
	}
	cc := c.CachedInfo().Config
	cc.PriorityPolicy, cc.PriorityGroups = jetstream.PriorityPolicyPrioritized, []string{priorityGroup}
	c, err = s.js.UpdateConsumer(rctx, s.lay.stream, cc)
	if err != nil {
		return wrapBrokerErr(err)
	}
	if got := c.CachedInfo().Config.PriorityPolicy; got != jetstream.PriorityPolicyPrioritized {
		return errors.New("natssem: the server kept the consumer's arrival order (a server before 2.12 in the cluster)")
	}
	return nil
}

// serverAtLeast reports whether version (nats-server's, "2.12.1" or
// "2.12.0-beta.1") is at least major.minor.
func serverAtLeast(version string, major, minor int) bool {
	parts := strings.SplitN(version, ".", 3)
	if len(parts) < 2 {
		return false
	}
	ma, err1 := strconv.Atoi(parts[0])
	mi, err2 := strconv.Atoi(strings.SplitN(parts[1], "-", 2)[0])
	if err1 != nil || err2 != nil {
		return false
	}
	return ma > major || ma == major && mi >= minor
}
