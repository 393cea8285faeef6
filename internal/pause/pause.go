// Package pause waits out a retry delay unless the caller's context ends first.
package pause

import (
	"context"
	"time"
)

// For waits d or until ctx ends, whichever comes first; it reports whether the whole
// pause passed (false: ctx ended).
func For(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
