package main

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/conductor-go/conductor/httpclient"
)

// table is a tabwriter that takes cells rather than tab-joined strings.
type table struct{ tw *tabwriter.Writer }

func newTable(w io.Writer) *table {
	return &table{tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)}
}

func (t *table) row(cells ...string) {
	for i, c := range cells {
		if i > 0 {
			io.WriteString(t.tw, "\t")
		}
		// A tab or newline inside a value would break the alignment of every row.
		io.WriteString(t.tw, strings.Map(flattenSpace, c))
	}
	io.WriteString(t.tw, "\n")
}

func flattenSpace(r rune) rune {
	if r == '\t' || r == '\n' || r == '\r' {
		return ' '
	}
	return r
}

// flush writes the table out; a failed write (closed pipe) is reported on stderr.
func (t *table) flush(stderr io.Writer) int {
	if err := t.tw.Flush(); err != nil {
		fmt.Fprintf(stderr, "error: write output: %v\n", err)
		return exitReply
	}
	return exitOK
}

// orDash shows empty values (base-model LoRA, no replay endpoint) visibly.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }

// profileString is a hash profile on one line: the selectors, the seed, and the fields
// of issue 25 where set.
func profileString(p httpclient.HashProfile) string {
	s := p.Strategy + "/" + p.Algorithm + "/" + p.IndexProjection
	if p.PythonHashSeed != "" {
		s += " seed=" + p.PythonHashSeed
	}
	if p.ExtraKeys != "" {
		s += " extra_keys=" + p.ExtraKeys
	}
	if p.LoraPath != "" {
		s += " lora_path=" + p.LoraPath
	}
	if p.LookaheadTokens != 0 {
		s += " lookahead=" + itoa(p.LookaheadTokens)
	}
	return s
}

// writeServices prints the services table; full adds the columns watch leaves out to
// stay within a terminal's width. HASH_CHECK (the profile self-check) is always shown:
// a profile that does not reproduce the engine's hashes makes every query miss.
func writeServices(w io.Writer, l httpclient.ServiceList, full bool) {
	if len(l.Services) == 0 {
		fmt.Fprintln(w, "no services registered")
		return
	}
	t := newTable(w)
	if full {
		t.row("INSTANCE", "TENANT", "DP", "TYPE", "MODEL", "LORA", "BLOCK", "ENDPOINT", "REPLAY", "CACHE_GROUP", "MEDIA",
			"HASH_PROFILE", "HASH_CHECK")
	} else {
		t.row("INSTANCE", "TENANT", "DP", "TYPE", "MODEL", "LORA", "BLOCK", "ENDPOINT", "HASH_CHECK")
	}
	for _, s := range l.Services {
		cells := []string{s.InstanceID, s.TenantID, itoa(s.DPRank), s.Type, s.ModelName, orDash(s.LoraName),
			itoa(s.BlockSize), s.Endpoint}
		if full {
			cg := "-"
			if s.CacheGroup != nil {
				cg = itoa(*s.CacheGroup)
			}
			cells = append(cells, orDash(s.ReplayEndpoint), cg, orDash(strings.Join(s.IndexMedia, ",")), profileString(s.HashProfile))
		}
		t.row(append(cells, orDash(s.HashCheck))...)
	}
	t.tw.Flush()
}

// contextKey identifies a context across refreshes of watch.
type contextKey struct {
	tenant, model, lora string
	block               int64
}

func keyOf(c *httpclient.ContextView) contextKey {
	return contextKey{c.TenantID, c.ModelName, c.LoraName, c.BlockSize}
}

// writeView prints the contexts table. With change (watch), a CHANGE column shows how
// each prefix count moved since prev, the previous refresh ("-" on the first one).
func writeView(w io.Writer, v httpclient.GlobalView, change bool, prev map[contextKey]int64) {
	if len(v.Contexts) == 0 {
		fmt.Fprintln(w, "no contexts indexed")
		return
	}
	ctxs := slices.Clone(v.Contexts)
	slices.SortFunc(ctxs, func(a, b httpclient.ContextView) int {
		return cmp.Or(strings.Compare(a.TenantID, b.TenantID), strings.Compare(a.ModelName, b.ModelName),
			strings.Compare(a.LoraName, b.LoraName), cmp.Compare(a.BlockSize, b.BlockSize))
	})
	t := newTable(w)
	head := []string{"TENANT", "MODEL", "LORA", "BLOCK", "PREFIXES"}
	if change {
		head = append(head, "CHANGE")
	}
	t.row(append(head, "HASH_PROFILE", "ROOT", "INSTANCES")...)
	for i := range ctxs {
		c := &ctxs[i]
		cells := []string{c.TenantID, c.ModelName, orDash(c.LoraName), itoa(c.BlockSize), itoa(c.PrefixCount)}
		if change {
			delta := "-"
			if old, ok := prev[keyOf(c)]; ok {
				delta = fmt.Sprintf("%+d", c.PrefixCount-old)
			} else if prev != nil {
				delta = "new"
			}
			cells = append(cells, delta)
		}
		root := c.HashProfile.RootDigest
		if len(root) > 12 {
			root = root[:12] + "..."
		}
		t.row(append(cells, profileString(c.HashProfile), orDash(root), instancesString(c.Instances))...)
	}
	t.tw.Flush()
}

// instancesString renders {"a": [0, 1], "b": [0]} as "a[0,1] b[0]", sorted by id.
func instancesString(m map[string][]int64) string {
	if len(m) == 0 {
		return "-"
	}
	ids := make([]string, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	var sb strings.Builder
	for i, id := range ids {
		if i > 0 {
			sb.WriteByte(' ')
		}
		sb.WriteString(id)
		sb.WriteByte('[')
		for j, r := range m[id] {
			if j > 0 {
				sb.WriteByte(',')
			}
			sb.WriteString(itoa(r))
		}
		sb.WriteByte(']')
	}
	return sb.String()
}

// writeQuery prints one row per instance, sorted by id. An instance with several DP
// ranks gets a row per rank under it, so the rank that holds the prefix is visible.
func writeQuery(w io.Writer, res *httpclient.QueryResult, ntokens int) {
	if len(res.Instances) == 0 {
		fmt.Fprintf(w, "%d tokens queried; no instances in this context\n", ntokens)
		return
	}
	plural := "s"
	if len(res.Instances) == 1 {
		plural = ""
	}
	fmt.Fprintf(w, "%d tokens queried, %d instance%s\n", ntokens, len(res.Instances), plural)
	hits := slices.Clone(res.Instances)
	slices.SortFunc(hits, func(a, b httpclient.InstanceHit) int { return strings.Compare(a.InstanceID, b.InstanceID) })
	t := newTable(w)
	t.row("INSTANCE", "RANK", "LONGEST", "DEVICE", "CPU_LOCAL", "CPU_SHARE", "DISK")
	for i := range hits {
		h := &hits[i]
		rank := "-"
		if len(h.Ranks) == 1 {
			rank = itoa(h.Ranks[0].Rank)
		} else if len(h.Ranks) > 1 {
			rank = "all"
		}
		t.row(h.InstanceID, rank, itoa(h.LongestMatched), itoa(h.Device), itoa(h.CPULocal), itoa(h.CPUShare), itoa(h.Disk))
		if len(h.Ranks) > 1 {
			for _, r := range h.Ranks {
				t.row("", itoa(r.Rank), "", itoa(r.Device), itoa(r.CPULocal), itoa(r.CPUShare), itoa(r.Disk))
			}
		}
	}
	t.tw.Flush()
}
