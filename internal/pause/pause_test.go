package pause

import (
	"context"
	"testing"
	"time"
)

func TestForPasses(t *testing.T) {
	if !For(context.Background(), time.Millisecond) {
		t.Fatal("a pause under a live context did not pass")
	}
}

// TestForEndsWithContext: an ended context cuts the pause short (an hour would time the
// test out).
func TestForEndsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if For(ctx, time.Hour) {
		t.Fatal("a pause under an ended context passed")
	}
}
