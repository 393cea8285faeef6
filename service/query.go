package service

import (
	"errors"
	"math"
	"strconv"

	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/hashing"
)

// KeyCheck says who applies the query rules to a query's context key (CheckQueryKey), so
// that they run once per query.
type KeyCheck bool

const (
	// CheckKey: the service applies them (the RPC wire's struct_pack fields carry no
	// such rule).
	CheckKey KeyCheck = false
	// KeyChecked: the transport's strict decoder applied them already. The HTTP contract
	// checks model and block_size in its own field order, interleaved with the type
	// checks of every field, so wire/httpapi's decoder must apply them where they fall.
	KeyChecked KeyCheck = true
)

// CheckQueryKey applies the query rules to a query's context: a model is named, the block
// size is positive, and an empty tenant is "default".
func CheckQueryKey(key *engine.ContextKey) *Error {
	if key.ModelName == "" {
		return invalidField("invalid_value", "model", "model must not be empty")
	}
	if key.BlockSize <= 0 {
		return invalidField("out_of_range", "block_size", "block_size must be a positive integer")
	}
	if key.TenantID == "" {
		key.TenantID = "default"
	}
	return nil
}

// checkQuery is what every query entry does first: refuse work while stopping, then the
// query rules unless chk says they were applied.
func (s *Service) checkQuery(key *engine.ContextKey, chk KeyCheck) *Error {
	if s.stopping.Load() {
		return errStopping
	}
	if chk == KeyChecked {
		return nil
	}
	return CheckQueryKey(key)
}

// Query answers a prefix-hit query. It reads the index without locks.
func (s *Service) Query(q *engine.Query, chk KeyCheck, res *engine.Result) *Error {
	if err := s.checkQuery(&q.Key, chk); err != nil {
		return err
	}
	if err := s.eng.Query(q, res); err != nil {
		return queryError(err)
	}
	return nil
}

// QueryByHash answers a prefix-hit query whose block keys the caller computed: keys[i] is
// the projected key of block i, and each block stands for BlockSize tokens, so counts
// are clamped at len(keys)*BlockSize. The rules are Query's. There is no cache salt: a
// salt is already folded into the keys.
func (s *Service) QueryByHash(key engine.ContextKey, keys []uint64, instanceFilter string, chk KeyCheck, res *engine.Result) *Error {
	if err := s.checkQuery(&key, chk); err != nil {
		return err
	}
	positions := math.MaxInt
	if n := int64(len(keys)); n == 0 || key.BlockSize <= math.MaxInt/n {
		positions = int(n * key.BlockSize)
	}
	if err := s.eng.QueryKeys(key, keys, positions, instanceFilter, res); err != nil {
		return queryError(err)
	}
	return nil
}

// queryError maps an engine query failure to a service error.
func queryError(err error) *Error {
	var te *hashing.TokenError
	if errors.As(err, &te) {
		return &Error{Code: CodeInvalidParams, Reason: "out_of_range", Field: "token_ids", Index: te.Index, HasIndex: true,
			Msg: "token_ids[" + strconv.Itoa(te.Index) + "] cannot be encoded by the context's hash strategy"}
	}
	return &Error{Code: CodeInternal, Msg: "query failed: " + err.Error()}
}
