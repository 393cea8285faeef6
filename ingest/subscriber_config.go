package ingest

import (
	"log/slog"
	"time"

	"github.com/conductor-go/conductor/ingest/zmqtransport"
)

// SubscriberConfig configures one subscription (one registered service).
type SubscriberConfig struct {
	// Name is the service key, used in logs.
	Name string
	// Endpoint is the engine's ZMQ PUB endpoint; the SUB socket connects to it.
	Endpoint string
	// ReplayEndpoint is the engine's ROUTER replay endpoint; "" disables replay (Mooncake
	// master streams have none), and then any sequence gap marks the source stale.
	ReplayEndpoint string
	// PollTimeout bounds every wait when no timer (replay, catch-up, join check,
	// protocol-error grace) is due sooner; Stop wakes a wait at once.
	PollTimeout time.Duration
	// ReplayTimeout is how long one replay attempt waits for its next reply message.
	ReplayTimeout time.Duration
	// ReplayRecoveryTimeout is the total time allowed to close one gap, retries included.
	ReplayRecoveryTimeout time.Duration
	// ReconnectDelay is the pause before retrying a failed replay attempt and before
	// reopening the SUB socket after a socket error.
	ReconnectDelay time.Duration
	// MaxRecoveryMessages bounds the live messages buffered while a gap is recovered.
	MaxRecoveryMessages int
	// MaxRecoveryBytes bounds their bytes (topic plus payload).
	MaxRecoveryBytes int
	// CatchUpOnStart asks the replay endpoint, right after Start and without waiting for
	// a live batch, for everything the publisher still buffers, so that batches
	// published before the subscriber existed are applied too; it is repeated after a
	// detected publisher restart. It is best effort: the publisher's ring rarely
	// reaches back to sequence 0, and the index starts empty, so history older than
	// the ring can only make answers under-report. A replay that starts later than
	// asked is accepted, and a catch-up that fails (no reply within ReplayTimeout, no
	// replay server, a malformed reply) is counted and the first live batch becomes
	// the baseline; neither marks the source stale. Once a replayed batch has been
	// applied, any later gap is recovered under the strict rules. Ignored without a
	// ReplayEndpoint.
	CatchUpOnStart bool
	// JoinCheckDelay (with CatchUpOnStart): this long after the SUB socket first connects,
	// and once the catch-up has completed, the replay endpoint is asked once more for
	// everything from the next expected batch on. The catch-up reads the publisher's ring
	// before the subscription has reached the publisher (ZMQ's slow joiner): batches
	// published in between are never received live, and on a stream that then goes quiet
	// no later batch would reveal the gap, so a removal in that window would be missed
	// for good. What the check recovers counts as a gap (Gaps, Dropped). It is best
	// effort like the catch-up while no live batch shows a gap. A live batch makes it
	// moot (its sequence shows any gap after the catch-up): the first one cancels a
	// pending check and ends a running one that it follows on from. 0 takes
	// DefaultJoinCheckDelay; negative turns the check off.
	JoinCheckDelay time.Duration
	// Logger receives the subscriber's log lines; nil discards them.
	Logger *slog.Logger
	// Transport is the shared ZMQ context the sockets are opened in; nil gives the
	// subscriber a private one, terminated when it stops.
	Transport *zmqtransport.Transport
	// MaxMessageSize bounds one ZMQ message on the SUB and replay sockets (libzmq
	// ZMQ_MAXMSGSIZE); 0 takes DefaultMaxMessageSize, -1 is unlimited. libzmq refuses a
	// bigger message before allocating it and drops the connection; the subscriber
	// counts it (ProtocolErrors), reconnects, and recovers the lost batch through replay
	// (without replay, or when the replayed batch is as big, the source goes stale).
	MaxMessageSize int64
	// BufferBytes bounds the bytes of the messages libzmq may hold for this subscription
	// before the subscriber reads them (a burst it cannot apply as fast as it arrives):
	// the SUB socket's high-water mark is BufferBytes / MaxMessageSize messages (RcvHWM).
	// Beyond it libzmq leaves the rest to TCP and the publisher's own queue. 0 takes
	// DefaultBufferBytes.
	BufferBytes int64
	// OpenRetryMax bounds the backoff between attempts to open the sockets when Start
	// found the process out of file descriptors; 0 takes DefaultOpenRetryMax.
	OpenRetryMax time.Duration
}

// SubscriberStats is a snapshot of a subscriber's counters.
type SubscriberStats struct {
	Received      uint64 // live multipart messages read from the SUB socket
	Applied       uint64 // batches the handler accepted (live and replayed)
	Dropped       uint64 // sequence numbers missing at gaps (counted even when replay recovers them)
	Duplicates    uint64 // live or replayed batches dropped as already applied
	Gaps          uint64 // gaps detected in the live stream
	ReplaysOK     uint64 // recoveries that closed their gap
	ReplaysFailed uint64 // gap recoveries that ended with the source stale
	ReplayRetries uint64 // replay attempts that failed and were retried
	ConsumeErrors uint64 // malformed live messages (frame count, sequence length or range)
	Rejected      uint64 // batches the handler rejected
	Restarts      uint64 // publisher restarts detected (sequence reset)
	Reconnects    uint64 // SUB reconnections to the publisher
	// CatchUps counts catch-ups (CatchUpOnStart) that completed, including those that
	// found nothing to replay.
	CatchUps uint64
	// CatchUpsFailed counts catch-ups that did not complete. Before any replayed batch
	// was applied the source carries on from the live stream and stays fresh. After
	// one, the strict rules hold: a timeout continues as a gap recovery (counted under
	// Replays*), and a skipped sequence or a full buffer makes the source stale.
	CatchUpsFailed uint64
	// JoinChecks counts join checks (SubscriberConfig.JoinCheckDelay) that completed;
	// JoinChecksFailed those given up (no reply) or ended stale.
	JoinChecks, JoinChecksFailed uint64
	// HolesTaken counts gaps that could not be closed and that the handler took as held
	// elsewhere (HoleHandler: a replica bootstrapping from a peer's snapshot) instead of
	// the source going stale.
	HolesTaken uint64
	// ProtocolErrors counts connections libzmq dropped for a protocol error: a message
	// over MaxMessageSize, or malformed ZMTP. Each is reopened.
	ProtocolErrors uint64
	// OpenFailures counts attempts to open the sockets that failed for lack of
	// resources (file descriptors); Waiting is set until one succeeds.
	OpenFailures uint64
	Waiting      bool
	// RecvBufferBytes is the size of the receive buffer now (it grows to the largest
	// message and is given back after an outlier).
	RecvBufferBytes int64
	Stale           bool
	// LastEventUnixNano is when the last live message arrived (0 = never).
	LastEventUnixNano int64
}
