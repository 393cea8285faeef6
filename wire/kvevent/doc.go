// Package kvevent decodes the KV-cache event batches that vLLM, SGLang and the Mooncake
// Store master publish over ZMQ (the third frame of each message): envelope, per-event
// key checks for each publisher and tag, hash projections and token ids
// (engine-formats.md, reference notes §5). The publisher kind (wire/publisher) picks the
// rules. Decoding is zero-copy over the payload and, after warm-up, allocation-free; an
// envelope failure drops the message, an event failure only that event.
//
// Files: event.go (the decoded Batch/Event and error sentinels), decoder.go (Decoder,
// envelope and per-event checks), fields.go (the recognised keys per publisher and tag),
// values.go (field value readers over wire/internal/msgpack).
package kvevent
