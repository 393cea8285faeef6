package replay

// finishHeap is a min-heap of request finish times (simulated seconds), written out
// rather than through container/heap so that pushes do not box values.
type finishHeap []float64

func (h *finishHeap) push(v float64) {
	*h = append(*h, v)
	a := *h
	i := len(a) - 1
	for i > 0 {
		p := (i - 1) / 2
		if a[p] <= a[i] {
			break
		}
		a[p], a[i] = a[i], a[p]
		i = p
	}
}

func (h *finishHeap) pop() {
	a := *h
	n := len(a) - 1
	a[0] = a[n]
	a = a[:n]
	i := 0
	for {
		l, r, m := 2*i+1, 2*i+2, i
		if l < n && a[l] < a[m] {
			m = l
		}
		if r < n && a[r] < a[m] {
			m = r
		}
		if m == i {
			break
		}
		a[m], a[i] = a[i], a[m]
		i = m
	}
	*h = a
}

// expire drops every finish time <= t.
func (h *finishHeap) expire(t float64) {
	for len(*h) > 0 && (*h)[0] <= t {
		h.pop()
	}
}

// loadModel tracks the requests each instance and rank is serving in simulated time
// (the trace's clock, whatever the replay pace): a request occupies its rank for its
// prefill of the uncached tokens plus its decode.
type loadModel struct {
	prefillTPS float64
	decodeSec  float64
	ranks      [][]finishHeap
	instLoad   []int
	rankLoad   [][]int
	assigned   []int
	peakActive int
}

func newLoadModel(instances, ranks int, prefillTPS, decodeMsPerToken float64) *loadModel {
	m := &loadModel{prefillTPS: prefillTPS, decodeSec: decodeMsPerToken / 1000}
	m.ranks = make([][]finishHeap, instances)
	m.rankLoad = make([][]int, instances)
	m.instLoad = make([]int, instances)
	m.assigned = make([]int, instances)
	for i := range m.ranks {
		m.ranks[i] = make([]finishHeap, ranks)
		m.rankLoad[i] = make([]int, ranks)
	}
	return m
}

// advance moves the clock to t, finishing requests.
func (m *loadModel) advance(t float64) {
	for i, rs := range m.ranks {
		total := 0
		for d := range rs {
			rs[d].expire(t)
			m.rankLoad[i][d] = len(rs[d])
			total += len(rs[d])
		}
		m.instLoad[i] = total
	}
}

// start records a request landing on (i, d) at t with uncached prompt tokens and
// output tokens.
func (m *loadModel) start(i, d int, t float64, uncached, output int) {
	service := float64(uncached)/m.prefillTPS + float64(output)*m.decodeSec
	m.ranks[i][d].push(t + service)
	m.rankLoad[i][d]++
	m.instLoad[i]++
	m.assigned[i]++
	m.peakActive = max(m.peakActive, m.instLoad[i])
}

// imbalance is the busiest instance's request count over the mean.
func (m *loadModel) imbalance() float64 {
	total, busiest := 0, 0
	for _, a := range m.assigned {
		total += a
		busiest = max(busiest, a)
	}
	if total == 0 {
		return 0
	}
	return float64(busiest) * float64(len(m.assigned)) / float64(total)
}

// pickLongest returns the index with the longest match among candidates whose load is
// within slack of the least loaded one (slack < 0: all candidates), breaking ties by
// lower load and then by rotating from start so that equal candidates share the work.
func pickLongest(match []int64, load []int, slack int, start int) int {
	n := len(match)
	minLoad := load[0]
	for _, l := range load[1:] {
		minLoad = min(minLoad, l)
	}
	best := -1
	for k := 0; k < n; k++ {
		i := (start + k) % n
		if slack >= 0 && load[i] > minLoad+slack {
			continue
		}
		if best < 0 || match[i] > match[best] || (match[i] == match[best] && load[i] < load[best]) {
			best = i
		}
	}
	return best
}
