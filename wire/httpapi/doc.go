// Package httpapi is the msgpack body codec of the indexer's HTTP API
// (indexer-http-api.txt): strict decoders for the /query, /query_by_hash, /register and
// /unregister request bodies, appenders for their responses, and the error bodies
// (RequestError with upstream's reasons). Decoders alias the request body instead of
// copying it and walk it with the shared iterative reader (wire/internal/msgpack), so a
// hostile body can neither recurse nor size a buffer from a lying header; a whole body
// is proved parsable before a semantic error is reported, as upstream does.
//
// Files: walk.go (the strict map walk), query.go and query_hash.go (the query bodies and
// their token/hash arrays), register.go, response.go, errors.go.
package httpapi
