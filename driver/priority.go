package driver

import (
	"context"
	"fmt"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/internal/ctxclass"
)

// PriorityOf returns the class a wait under ctx asks for (see
// tokensem.WithPriority; 0 when none), or an error wrapping
// tokensem.ErrInvalidOption for a class out of range. A backend serves a
// waiter of a higher class first, in arrival order within one, by the
// broker's own order, or refuses a class other than 0 with
// tokensem.ErrPriorityUnsupported.
func PriorityOf(ctx context.Context) (tokensem.Priority, error) {
	p := tokensem.Priority(ctxclass.Of(ctx))
	if p < tokensem.LowestPriority || p > tokensem.HighestPriority {
		return 0, fmt.Errorf("%w: priority %d is outside [%d, %d]", tokensem.ErrInvalidOption, p, tokensem.LowestPriority, tokensem.HighestPriority)
	}
	return p, nil
}
