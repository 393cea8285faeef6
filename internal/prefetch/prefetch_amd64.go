package prefetch

// lines issues PREFETCHT0 for each of the n addresses from p.
//
//go:noescape
func lines(p *uintptr, n int)
