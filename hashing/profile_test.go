package hashing

import (
	"errors"
	"testing"
)

func TestResolveCombos(t *testing.T) {
	strategies := []string{"vllm_v1", "sglang", "sglang_bigram", "vllm_v2", "VLLM_V1", "", "sglang "}
	algorithms := []string{"sha256", "sha256_cbor", "sha256_raw", "md5", "SHA256", "xxhash", ""}
	projections := []string{"low64_be", "first64_be", "high64_be", "LOW64_BE", ""}
	accepted := 0
	for _, s := range strategies {
		for _, a := range algorithms {
			for _, pr := range projections {
				p, err := Resolve(s, a, "0", pr)
				// Expected field by upstream precedence.
				wantField := ""
				switch {
				case s != "vllm_v1" && s != "sglang" && s != "sglang_bigram":
					wantField = FieldStrategy
				case s == "vllm_v1" && a != "sha256" && a != "sha256_cbor",
					s != "vllm_v1" && a != "sha256_raw":
					wantField = FieldAlgorithm
				case s == "vllm_v1" && pr != "low64_be", s != "vllm_v1" && pr != "first64_be":
					wantField = FieldProjection
				}
				if wantField == "" {
					if err != nil {
						t.Errorf("Resolve(%q,%q,%q) rejected: %v", s, a, pr, err)
						continue
					}
					accepted++
					if p.StrategyName() != s || p.AlgorithmName() != a || p.ProjectionName() != pr {
						t.Errorf("Resolve(%q,%q,%q) names = %s/%s/%s", s, a, pr, p.StrategyName(), p.AlgorithmName(), p.ProjectionName())
					}
					continue
				}
				var fe *FieldError
				if !errors.As(err, &fe) {
					t.Errorf("Resolve(%q,%q,%q) = %v, want *FieldError %s", s, a, pr, err, wantField)
					continue
				}
				if fe.Field != wantField {
					t.Errorf("Resolve(%q,%q,%q) field %q, want %q (%v)", s, a, pr, fe.Field, wantField, err)
				}
				if p != (Profile{}) {
					t.Errorf("rejected profile is not zero: %+v", p)
				}
			}
		}
	}
	if accepted != 4 {
		t.Errorf("accepted %d combinations, want 4", accepted)
	}
}

func TestResolveSeed(t *testing.T) {
	cases := []struct {
		seed string
		ok   bool
	}{
		{"0", true}, {"00", true}, {"42", true}, {"random", true}, {"4294967295", true},
		{"0004294967295", true},
		{"", false}, {"+1", false}, {"-1", false}, {" 0", false}, {"0 ", false}, {"0\n", false},
		{"1.0", false}, {"Random", false}, {"random ", false}, {"RANDOM", false},
		{"4294967296", false}, {"99999999999999999999999", false}, {"1e3", false}, {"0x10", false},
		{"\xff", false}, {"1\xff", false}, {"random\xc3", false}, {"٣", false},
	}
	for _, algo := range []string{"sha256", "sha256_cbor"} {
		for _, c := range cases {
			p, err := Resolve("vllm_v1", algo, c.seed, "low64_be")
			if c.ok {
				if err != nil {
					t.Errorf("%s seed %q rejected: %v", algo, c.seed, err)
				} else if p.Seed != c.seed {
					t.Errorf("%s seed %q kept as %q", algo, c.seed, p.Seed)
				}
				continue
			}
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field != FieldSeed {
				t.Errorf("%s seed %q: err %v, want python_hash_seed FieldError", algo, c.seed, err)
			}
		}
	}
	// A wrong seed loses to a wrong projection or algorithm.
	_, err := Resolve("vllm_v1", "sha256", "-1", "first64_be")
	if fe := (*FieldError)(nil); !errors.As(err, &fe) || fe.Field != FieldProjection {
		t.Errorf("seed+projection wrong: %v, want index_projection", err)
	}
	_, err = Resolve("vllm_v1", "md5", "-1", "first64_be")
	if fe := (*FieldError)(nil); !errors.As(err, &fe) || fe.Field != FieldAlgorithm {
		t.Errorf("seed+algorithm wrong: %v, want algorithm", err)
	}
	// SGLang ignores the seed entirely, even an invalid one.
	for _, seed := range []string{"", "-1", "junk", "\xff", "42"} {
		p, err := Resolve("sglang_bigram", "sha256_raw", seed, "first64_be")
		if err != nil || p.Seed != "0" || p.Root != ([32]byte{}) {
			t.Errorf("sglang seed %q: %+v, %v", seed, p, err)
		}
	}
	// "0" and "00" are different vLLM profiles.
	a, _ := Resolve("vllm_v1", "sha256", "0", "low64_be")
	b, _ := Resolve("vllm_v1", "sha256", "00", "low64_be")
	if a.Root == b.Root || a.Equal(b) {
		t.Errorf(`seeds "0" and "00" must give different roots and unequal profiles`)
	}
}

func TestProfileEqual(t *testing.T) {
	mk := func(s, a, seed, pr string) Profile {
		t.Helper()
		p, err := Resolve(s, a, seed, pr)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	v0 := mk("vllm_v1", "sha256_cbor", "0", "low64_be")
	if !v0.Equal(mk("vllm_v1", "sha256_cbor", "0", "low64_be")) {
		t.Error("identical vllm profiles unequal")
	}
	if v0.Equal(mk("vllm_v1", "sha256", "0", "low64_be")) {
		t.Error("different algorithms equal")
	}
	if v0.Equal(mk("vllm_v1", "sha256_cbor", "random", "low64_be")) {
		t.Error("different seeds equal")
	}
	// Seed compared for vllm_v1 even when roots agree (a hand-built profile).
	forged := v0
	forged.Seed = "1"
	if v0.Equal(forged) {
		t.Error("vllm_v1 seed not compared")
	}
	forged = v0
	forged.Root[0] ^= 1
	if v0.Equal(forged) {
		t.Error("root not compared")
	}
	sg := mk("sglang", "sha256_raw", "", "first64_be")
	sgOther := sg
	sgOther.Seed = "7" // not reachable through Resolve, but Equal must ignore it
	if !sg.Equal(sgOther) {
		t.Error("sglang seed must not be compared")
	}
	if sg.Equal(mk("sglang_bigram", "sha256_raw", "", "first64_be")) {
		t.Error("sglang and sglang_bigram equal")
	}
	if (Profile{}).StrategyName() != "" || (Profile{}).AlgorithmName() != "" || (Profile{}).ProjectionName() != "" {
		t.Error("zero profile must have empty names")
	}
}
