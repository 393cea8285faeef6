package replay

import (
	"testing"
	"time"
)

// TestLatencyCDFs: latencies are cut by prompt length and each bucket's percentiles are
// its own distribution (p0 = min, p50 = median, p100 = max).
func TestLatencyCDFs(t *testing.T) {
	var lat []time.Duration
	var plen []int32
	for i := 1; i <= 100; i++ {
		lat = append(lat, time.Duration(i)*time.Microsecond, time.Duration(1000+i)*time.Microsecond)
		plen = append(plen, 100, 9000)
	}
	cdfs := latencyCDFs(lat, plen)
	if len(cdfs) != 2 || cdfs[0].Prompts != "<2K tokens" || cdfs[1].Prompts != "8K-32K tokens" {
		t.Fatalf("buckets %+v", cdfs)
	}
	for i, base := range []float64{0, 1000} {
		p := cdfs[i].PercentilesUS
		if cdfs[i].Count != 100 || len(p) != 101 || p[0] != base+1 || p[50] != base+50 || p[100] != base+100 {
			t.Errorf("bucket %d: count %d p0 %v p50 %v p100 %v", i, cdfs[i].Count, p[0], p[50], p[100])
		}
	}
}
