package translate

import (
	"errors"
	"fmt"
	"strings"

	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/wire/kvevent"
	"github.com/conductor-go/conductor/wire/publisher"
)

// medium is one storage medium an engine names in its events.
type medium uint8

// The media of vLLM (GPU, CPU, STORAGE) and SGLang (GPU, CPU_PINNED, DISK) events.
const (
	mediumGPU       medium = 1 << iota // vLLM and SGLang accelerator memory
	mediumCPU                          // vLLM CPU offloading
	mediumStorage                      // vLLM offloading to storage
	mediumCPUPinned                    // SGLang HiCache host memory
	mediumDisk                         // SGLang HiCache disk
)

// mediaNames are the wire names, as index_media lists them.
var mediaNames = []struct {
	m    medium
	name string
	tier engine.EngineTier
}{
	{mediumGPU, "GPU", engine.TierDevice},
	{mediumCPU, "CPU", engine.TierCPULocal},
	{mediumStorage, "STORAGE", engine.TierDisk},
	{mediumCPUPinned, "CPU_PINNED", engine.TierCPULocal},
	{mediumDisk, "DISK", engine.TierDisk},
}

// Default media, as the contract indexes them.
const (
	defaultVLLMMedia   = mediumGPU
	defaultSGLangMedia = mediumGPU | mediumCPUPinned | mediumDisk
	vllmMedia          = mediumGPU | mediumCPU | mediumStorage
	sglangMedia        = mediumGPU | mediumCPUPinned | mediumDisk
)

// MediaSet is the set of event media a handler indexes (a registration's index_media),
// each in the tier it maps to: vLLM GPU → device, CPU → cpu_local, STORAGE → disk;
// SGLang GPU → device, CPU_PINNED → cpu_local, DISK → disk. The zero value is the
// contract's default: vLLM GPU only, SGLang all three. Build others with
// ParseIndexMedia.
type MediaSet struct{ bits medium }

// ErrIndexMedia is the rejection of an index_media list; the error names the value.
var ErrIndexMedia = errors.New("invalid index_media")

// ParseIndexMedia validates a registration's index_media for a publisher kind: a
// non-empty list of the kind's media names (case-insensitive, duplicates allowed).
// nil is the default set, and so is a list naming exactly the default media (the
// result is the zero value then, so that equal sets compare equal with ==). Mooncake
// sources take none: their media map to shared tiers.
func ParseIndexMedia(kind publisher.Kind, names []string) (MediaSet, error) {
	if names == nil {
		return MediaSet{}, nil
	}
	var allowed medium
	switch kind {
	case publisher.VLLM:
		allowed = vllmMedia
	case publisher.SGLang:
		allowed = sglangMedia
	default:
		return MediaSet{}, fmt.Errorf("%w: %s sources do not take index_media", ErrIndexMedia, kind)
	}
	if len(names) == 0 {
		return MediaSet{}, fmt.Errorf("%w: the list is empty (leave it out for the default)", ErrIndexMedia)
	}
	var s MediaSet
	for _, n := range names {
		m := mediumNamed(n)
		if m == 0 || m&allowed == 0 {
			return MediaSet{}, fmt.Errorf("%w: %q is not a %s medium (want %s)", ErrIndexMedia, n, kind, mediaList(allowed))
		}
		s.bits |= m
	}
	if s.bits == (MediaSet{}).effective(kind) {
		return MediaSet{}, nil
	}
	return s, nil
}

// Explicit reports whether the set differs from the contract's default (what a
// registration must record as its index_media).
func (s MediaSet) Explicit() bool { return s.bits != 0 }

func mediumNamed(n string) medium {
	for _, e := range mediaNames {
		if strings.EqualFold(n, e.name) {
			return e.m
		}
	}
	return 0
}

func mediaList(set medium) string {
	var out []string
	for _, e := range mediaNames {
		if set&e.m != 0 {
			out = append(out, e.name)
		}
	}
	return strings.Join(out, ", ")
}

// effective is the set for a kind, the default when s is the zero value.
func (s MediaSet) effective(kind publisher.Kind) medium {
	switch {
	case s.bits != 0:
		return s.bits
	case kind == publisher.SGLang:
		return defaultSGLangMedia
	}
	return defaultVLLMMedia
}

// mooncakeMedia are the media a Mooncake master source indexes, always (its memory
// replicas in the cpu_share tier, its disk replicas in disk).
var mooncakeMedia = []string{"CPU", "CPU_PINNED", "DISK"}

// Names lists the media indexed for a kind, in canonical spelling (for views).
func (s MediaSet) Names(kind publisher.Kind) []string {
	if kind == publisher.Mooncake {
		return append([]string(nil), mooncakeMedia...)
	}
	set := s.effective(kind)
	var out []string
	for _, e := range mediaNames {
		if set&e.m != 0 {
			out = append(out, e.name)
		}
	}
	return out
}

// clearMask is the engine tiers an AllBlocksCleared empties: those of the indexed media.
// The engine's cache reset empties the GPU; a connector's tiers may be reset with it,
// and an entry kept after its block is gone would be a hit that is not there.
func (s MediaSet) clearMask(kind publisher.Kind) engine.TierMask {
	set := s.effective(kind)
	var mask engine.TierMask
	for _, e := range mediaNames {
		if set&e.m != 0 {
			mask |= 1 << e.tier
		}
	}
	return mask
}

// vllmMedium classifies a vLLM event medium (0: none vLLM names).
func vllmMedium(m kvevent.NullBytes) medium {
	switch {
	case kvevent.MediumIs(m.Bytes, "gpu"):
		return mediumGPU
	case kvevent.MediumIs(m.Bytes, "cpu"):
		return mediumCPU
	case kvevent.MediumIs(m.Bytes, "storage"):
		return mediumStorage
	}
	return 0
}

// sglangMedium classifies an SGLang event medium: nil is the GPU, "cpu" an older
// spelling of CPU_PINNED (0: not an SGLang medium).
func sglangMedium(m kvevent.NullBytes) medium {
	switch {
	case !m.Valid || kvevent.MediumIs(m.Bytes, "gpu"):
		return mediumGPU
	case kvevent.MediumIs(m.Bytes, "cpu_pinned") || kvevent.MediumIs(m.Bytes, "cpu"):
		return mediumCPUPinned
	case kvevent.MediumIs(m.Bytes, "disk"):
		return mediumDisk
	}
	return 0
}

// tierOf is the engine tier of a medium.
func tierOf(m medium) engine.EngineTier {
	for _, e := range mediaNames {
		if e.m == m {
			return e.tier
		}
	}
	return engine.TierDevice
}
