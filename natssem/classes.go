package natssem

import (
	"context"
	"errors"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// upgradeClasses makes a semaphore whose token consumer serves waiters in
// arrival order only (made on a server before 2.12) serve them by class,
// now that the server it is reached through can: Init runs it on every
// ready semaphore, and it costs one consumer info when there is nothing to
// do. It returns the configuration as it left it, and ok when that is not
// cfg (another admin's upgrade counts). A step that fails is logged, and
// Init still succeeds; the next Init finishes what this one left.
//
// Every pull names the priority group (pullBodies), which a plain consumer
// ignores, so no pull is refused on either side of the update. First the
// configuration names the group, under the admin lock; then the consumer
// is updated in place to the prioritized policy (its delivered,
// unacknowledged tokens stay with their holders, with their leases). The
// configuration's group is what lets a wait in a class other than 0 in.
//
// What is decided is the consumer's policy as read back, not the
// configuration: an answer lost after its write landed (a configuration
// naming the group over a consumer in arrival order) is finished by the
// next Init. The configuration is written back without the group when a
// server refused the policy as unknown, or the server refused the update
// otherwise or dropped the policy and the consumer reads back in arrival
// order: a wait in a class other than 0 then fails with
// ErrPriorityUnsupported rather than be served in arrival order.
//
// A cluster part-way through an upgrade (seen with nats-server 2.10 and
// 2.11 beside 2.15) keeps the consumer with the policy on the newer
// servers and without it on an older one, which cannot read it and
// refuses it, and may keep its copy so even once upgraded; the consumer
// serves by class or in arrival order as its leader moves (pulls suit
// both), and a read from the leader alone cannot tell. So an Init that
// finds the configuration without the group sends the update even when
// the consumer reads prioritized: once every server is 2.12 or later, it
// lands on all of them.
func (s *Semaphore) upgradeClasses(ctx context.Context, cfg config) (_ config, ok bool) {
	if cfg.State != stateReady || !serverAtLeast(s.nc.ConnectedServerVersion(), 2, 12) {
		return cfg, false
	}
	cc, err := s.consumerConfig(ctx)
	if err != nil {
		s.log.Warn("serving priority classes: the token consumer", "err", err)
		return cfg, false
	}
	if cc.PriorityPolicy == jetstream.PriorityPolicyPrioritized && cfg.PriorityGroup != "" {
		return cfg, false // nothing to do, the common case
	}
	h, err := s.takeLock(ctx)
	if err != nil {
		s.log.Warn("serving priority classes: the admin lock", "err", err)
		return cfg, false
	}
	defer h.unlock()
	cur, rev, err := h.readConfig(ctx)
	if err != nil || cur.State != stateReady {
		return cfg, false
	}
	if cur.PriorityGroup != "" {
		if cc, err := s.consumerConfig(ctx); err == nil && cc.PriorityPolicy == jetstream.PriorityPolicyPrioritized {
			return cur, cur.PriorityGroup != cfg.PriorityGroup // another Init finished it meanwhile
		}
	}
	if cur.PriorityGroup == "" {
		up := cur
		up.PriorityGroup = priorityGroup
		if rev, err = s.updateConfig(ctx, up, rev); err != nil {
			// Its answer may be lost while the write landed: read again.
			if cur, rev, err = h.readConfig(ctx); err != nil || cur.PriorityGroup == "" {
				s.log.Warn("serving priority classes: the configuration", "err", err)
				return cfg, false
			}
		} else {
			cur = up
		}
	}
	prioritized, refused, err := s.prioritizeConsumer(ctx)
	switch {
	case prioritized:
	case refused:
		// A server refused the policy (the consumer may still serve by
		// class while a newer server leads it): without the group, a
		// wait in a class fails with ErrPriorityUnsupported rather than
		// be served in arrival order while an older server leads.
		s.log.Warn("serving priority classes: a server refused the policy (one before 2.12 in the cluster?); classes stay refused until an Init after every server runs 2.12 or later", "err", err)
		old := cur
		old.PriorityGroup = ""
		if _, werr := s.updateConfig(ctx, old, rev); werr == nil {
			cur = old
		}
		return cur, cur.PriorityGroup != cfg.PriorityGroup
	default:
		// Unknown (an answer lost): the configuration keeps the group,
		// which pulls may name on either consumer; the next Init finishes.
		s.log.Warn("serving priority classes: the token consumer's update; the next Init finishes it", "err", err)
		return cur, cur.PriorityGroup != cfg.PriorityGroup
	}
	if err := s.announceConfig(ctx); err != nil {
		// Clients learn of it within configTTL.
		s.log.Warn("serving priority classes: announcing the configuration", "err", err)
	}
	s.log.Info("the token consumer serves waiters by priority class")
	return cur, cur.PriorityGroup != cfg.PriorityGroup
}

// consumerConfig reads the token consumer's configuration (consumerInfo).
func (s *Semaphore) consumerConfig(ctx context.Context) (jetstream.ConsumerConfig, error) {
	info, err := s.consumerInfo(ctx)
	if err != nil {
		return jetstream.ConsumerConfig{}, err
	}
	return info.Config, nil
}

// prioritizeConsumer updates the token consumer in place to serve pulls
// by class. It sends the update even when the consumer reads prioritized
// already: its caller found the configuration without the group, which an
// earlier Init leaves when a server of the cluster refused the policy, and
// a server that refused it may hold its own copy of the consumer in
// arrival order (the read comes from the consumer's leader alone).
// prioritized says it serves by class, as read back afterwards; refused
// says a server refused the policy as unknown (whatever the leader reads
// back), or it was refused otherwise, or dropped unread, and the consumer
// reads back in arrival order. Neither, with err: the outcome is unknown
// (an update whose answer was lost may still land).
func (s *Semaphore) prioritizeConsumer(ctx context.Context) (prioritized, refused bool, err error) {
	cc, err := s.consumerConfig(ctx)
	if err != nil {
		return false, false, err
	}
	cc.PriorityPolicy, cc.PriorityGroups = jetstream.PriorityPolicyPrioritized, []string{priorityGroup}
	rctx, cancel := s.rtt(ctx)
	_, err = s.js.UpdateConsumer(rctx, s.lay.stream, cc)
	cancel()
	if isUnknownPolicy(err) {
		return false, true, err
	}
	got, rerr := s.consumerConfig(ctx)
	var apiErr *jetstream.APIError
	switch {
	case rerr != nil:
		return false, false, errors.Join(err, rerr)
	case got.PriorityPolicy == jetstream.PriorityPolicyPrioritized:
		return true, false, nil
	case errors.As(err, &apiErr):
		return false, true, err
	case err == nil:
		// Answered, and dropped unread (nats-server 2.10).
		return false, true, errors.New("natssem: the server kept the consumer's arrival order")
	}
	return false, false, err
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
