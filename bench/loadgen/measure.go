package loadgen

// How one cell is measured: its clients driving the conductor (drive), the conductor's
// CPU per query, and the cell's floor (the same requests answered by a bare server).

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/conductor-go/conductor/bench/floor"
	"github.com/conductor-go/conductor/bench/report"
	"github.com/conductor-go/conductor/bench/sim"
	"github.com/conductor-go/conductor/httpclient"
)

// measure runs one cell: conc clients send the prompts round-robin for cfg.Duration (or,
// when until is not nil, until it is closed), or, with once, each prompt exactly once
// (shared out among the clients).
// Each worker has a Client of its own (so its own connection, as a router process would)
// and a Session, whose pre-encoded sends keep encoding and pooling out of the latency.
func measure(ctx context.Context, cfg *Config, f *sim.Fleet, prompts []prompt, L int, sh Shape, conc int, once bool, until <-chan struct{}) (Cell, error) {
	cell := Cell{PromptTokens: L, Shape: sh, Concurrency: conc}
	var cpu0 time.Duration
	if cfg.Sample != nil {
		_, cpu0, _ = cfg.Sample()
	}
	all, wrong, elapsed, err := drive(ctx, cfg, cfg.Addr, f, prompts, conc, once, until)
	if err != nil {
		return cell, fmt.Errorf("%d tokens %s x%d: %w", L, sh, conc, err)
	}
	cell.Queries, cell.Wrong = len(all), wrong
	for i := range prompts {
		cell.RequestBytes += float64(len(prompts[i].body)) / float64(len(prompts))
	}
	cell.QPS = float64(len(all)) / elapsed.Seconds()
	cell.Latency = report.Summarize(all)
	if cfg.Sample != nil {
		if _, cpu1, err := cfg.Sample(); err == nil {
			cell.CPUPerQueryUS = perQueryUS(cpu1-cpu0, len(all))
		}
	}
	return cell, nil
}

// measureFloor measures cell's floor (Config.Floor): the floor server is given the
// conductor's answer to the cell's first prompt, then gets the cell's prompts from as
// many clients, for the cell's duration (or each prompt once, as the cell did).
func measureFloor(ctx context.Context, cfg *Config, cl *httpclient.Client, prompts []prompt, cell *Cell, once bool) error {
	s := cl.NewSession()
	if cfg.ByHash {
		s.Close()
		s = cl.NewByHashSession()
	}
	answer, err := s.QueryRaw(prompts[0].body)
	if err == nil {
		err = floor.SetReply(cfg.Floor.Addr, answer)
	}
	s.Close()
	if err != nil {
		return fmt.Errorf("floor of %d tokens %s x%d: %w", cell.PromptTokens, cell.Shape, cell.Concurrency, err)
	}
	_, cpu0, err := cfg.Floor.Sample()
	if err != nil {
		return fmt.Errorf("floor: %w", err)
	}
	all, _, _, err := drive(ctx, cfg, cfg.Floor.Addr, nil, prompts, cell.Concurrency, once, nil)
	if err != nil {
		return fmt.Errorf("floor of %d tokens %s x%d: %w", cell.PromptTokens, cell.Shape, cell.Concurrency, err)
	}
	_, cpu1, err := cfg.Floor.Sample()
	if err != nil {
		return fmt.Errorf("floor: %w", err)
	}
	cell.FloorQueries = len(all)
	cell.FloorCPUPerQueryUS = perQueryUS(cpu1-cpu0, len(all))
	return nil
}

// perQueryUS is cpu spread over n queries, in microseconds (0 for no query).
func perQueryUS(cpu time.Duration, n int) float64 {
	if n == 0 {
		return 0
	}
	return float64(cpu) / float64(time.Microsecond) / float64(n)
}

// drive is the client side of a cell: conc clients send prompts to addr, each client
// cycling through them from its own offset until the duration passes (or until closes),
// or, with once, taking each prompt once between them. With a fleet f each answer is
// decoded and checked against its prompt (wrong counts those that differ); without one
// the answers are not decoded. It returns every query's latency.
func drive(ctx context.Context, cfg *Config, addr string, f *sim.Fleet, prompts []prompt, conc int, once bool, until <-chan struct{}) (all []time.Duration, wrong int, elapsed time.Duration, err error) {
	type worker struct {
		lat   []time.Duration
		wrong int
		err   error
	}
	ws := make([]worker, conc)
	var wg sync.WaitGroup
	var nextOnce atomic.Int64
	start := time.Now()
	deadline := start.Add(cfg.Duration)
	for g := range ws {
		wg.Add(1)
		go func(w *worker, g int) {
			defer wg.Done()
			cl, err := httpclient.New(addr, httpclient.Options{Timeout: time.Minute, WriteBufferSize: cfg.WriteBufferSize})
			if err != nil {
				w.err = err
				return
			}
			defer cl.Close()
			s := cl.NewSession()
			if cfg.ByHash {
				s.Close()
				s = cl.NewByHashSession()
			}
			defer s.Close()
			var res httpclient.QueryResult
			var hits []*httpclient.InstanceHit
			w.lat = make([]time.Duration, 0, 1<<14)
			for k := g; ; k++ {
				if once {
					k = int(nextOnce.Add(1) - 1)
					if k >= len(prompts) {
						return
					}
				}
				p := &prompts[k%len(prompts)]
				t := time.Now()
				if f != nil {
					err = s.QueryEncoded(p.body, &res)
				} else {
					_, err = s.QueryRaw(p.body)
				}
				if err != nil {
					w.err = err
					return
				}
				done := time.Now()
				w.lat = append(w.lat, done.Sub(t))
				if f != nil {
					hits = f.Hits(hits, &res)
					if !answerMatches(hits, p) {
						w.wrong++
					}
				}
				if until != nil {
					select {
					case <-until:
						return
					default:
					}
				} else if !once && done.After(deadline) {
					return
				}
				if ctx.Err() != nil {
					return
				}
			}
		}(&ws[g], g)
	}
	wg.Wait()
	elapsed = time.Since(start)
	for i := range ws {
		if ws[i].err != nil {
			return nil, 0, elapsed, ws[i].err
		}
		all = append(all, ws[i].lat...)
		wrong += ws[i].wrong
	}
	return all, wrong, elapsed, nil
}

// answerMatches checks, given the answer filed by instance (sim.Fleet.Hits), the owner's
// longest match and that no other instance claims more.
func answerMatches(hits []*httpclient.InstanceHit, p *prompt) bool {
	for i, h := range hits {
		want := int64(0)
		if i == p.owner {
			want = p.expected
		}
		if h == nil || h.LongestMatched != want {
			return false
		}
	}
	return true
}
