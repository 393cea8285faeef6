package sim

// PublisherConfig tunes the ZMQ endpoints of a simulated rank.
type PublisherConfig struct {
	// Host is the interface to bind ("" = 127.0.0.1); ports are picked by the OS.
	Host string
	// BufferSteps bounds how many recent batches the replay ring keeps (vLLM's
	// buffer_steps); 0 means 10000.
	BufferSteps int
	// BufferBytes bounds the ring's payload bytes, because simulated batches for long
	// prompts are far larger than a real scheduler step; 0 means 8 MiB.
	BufferBytes int
	// SendHWM is the PUB high-water mark in messages (vLLM's hwm); 0 means 100000.
	SendHWM int
}

func (c PublisherConfig) withDefaults() PublisherConfig {
	if c.Host == "" {
		c.Host = "127.0.0.1"
	}
	if c.BufferSteps <= 0 {
		c.BufferSteps = 10000
	}
	if c.BufferBytes <= 0 {
		c.BufferBytes = 8 << 20
	}
	if c.SendHWM <= 0 {
		c.SendHWM = 100000
	}
	return c
}
