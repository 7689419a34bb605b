package natssem

import (
	"context"

	"github.com/tokensem/tokensem"
)

// SplitRelease does what Release does up to the token's hand-back (the
// renewals stop, the slot record is freed) and returns that hand-back, the
// Nak, for the test to send when it chooses: a test can then time the
// token's return against something else, such as a waiter giving up.
func SplitRelease(ctx context.Context, tp tokensem.Permit) (nak func() error, err error) {
	p := tp.(*Permit)
	if err := p.life.BeginRelease(); err != nil {
		return nil, err
	}
	p.stopRenewals()
	if err := p.free(ctx); err != nil {
		p.lose(err)
		return nil, p.Err()
	}
	return func() error {
		err := p.s.returned.nak(p.d.reply)
		_ = p.life.Released()
		return err
	}, nil
}
