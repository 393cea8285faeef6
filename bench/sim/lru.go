package sim

// lru is a bounded set of block keys with least-recently-used eviction. Nodes live in
// parallel slices addressed by int32, so a warmed-up cache allocates nothing: the map is
// sized for the capacity up front and freed nodes are recycled through a free list.
type lru struct {
	pos        map[uint64]int32
	keys       []uint64
	prev, next []int32
	head, tail int32 // head is the most recently used node, tail the least; -1 when empty
	free       int32 // free-list head, linked through next
	capacity   int
}

const nilNode = -1

func newLRU(capacity int) *lru {
	l := &lru{capacity: capacity, head: nilNode, tail: nilNode, free: nilNode}
	if capacity > 0 {
		l.pos = make(map[uint64]int32, capacity)
	} else {
		l.pos = make(map[uint64]int32)
	}
	return l
}

func (l *lru) len() int { return len(l.pos) }

func (l *lru) has(k uint64) bool {
	_, ok := l.pos[k]
	return ok
}

func (l *lru) unlink(i int32) {
	p, n := l.prev[i], l.next[i]
	if p != nilNode {
		l.next[p] = n
	} else {
		l.head = n
	}
	if n != nilNode {
		l.prev[n] = p
	} else {
		l.tail = p
	}
}

func (l *lru) pushFront(i int32) {
	l.prev[i] = nilNode
	l.next[i] = l.head
	if l.head != nilNode {
		l.prev[l.head] = i
	}
	l.head = i
	if l.tail == nilNode {
		l.tail = i
	}
}

// touch marks k most recently used; it reports whether k was present.
func (l *lru) touch(k uint64) bool {
	i, ok := l.pos[k]
	if !ok {
		return false
	}
	if l.head != i {
		l.unlink(i)
		l.pushFront(i)
	}
	return true
}

// full reports whether an insert would evict.
func (l *lru) full() bool { return l.capacity > 0 && len(l.pos) >= l.capacity }

// popLRU removes and returns the least recently used key.
func (l *lru) popLRU() (uint64, bool) {
	if l.tail == nilNode {
		return 0, false
	}
	i := l.tail
	k := l.keys[i]
	l.release(i, k)
	return k, true
}

func (l *lru) release(i int32, k uint64) {
	l.unlink(i)
	delete(l.pos, k)
	l.next[i] = l.free
	l.free = i
}

// insert adds an absent key as most recently used. The caller evicts first when full.
func (l *lru) insert(k uint64) {
	var i int32
	if l.free != nilNode {
		i = l.free
		l.free = l.next[i]
	} else {
		i = int32(len(l.keys))
		l.keys = append(l.keys, 0)
		l.prev = append(l.prev, 0)
		l.next = append(l.next, 0)
	}
	l.keys[i] = k
	l.pos[k] = i
	l.pushFront(i)
}

// remove deletes k; it reports whether k was present.
func (l *lru) remove(k uint64) bool {
	i, ok := l.pos[k]
	if !ok {
		return false
	}
	l.release(i, k)
	return true
}

// each calls fn for every key, most recent first.
func (l *lru) each(fn func(uint64)) {
	for i := l.head; i != nilNode; i = l.next[i] {
		fn(l.keys[i])
	}
}

// clear drops every key, keeping the allocated storage.
func (l *lru) clear() {
	clear(l.pos)
	l.keys, l.prev, l.next = l.keys[:0], l.prev[:0], l.next[:0]
	l.head, l.tail, l.free = nilNode, nilNode, nilNode
}
