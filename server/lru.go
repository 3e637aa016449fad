package server

import (
	"container/list"
	"sync"
)

// lru is the answer cache: least recently used first out, bounded by
// entries and by the bytes of the documents. engine.Cache memoizes programs
// inside one plan or search; this one keeps whole answers, keyed by the
// canonical request (the command and its fields, keys sorted, values
// compacted), so a repeated request costs a map lookup.
type lru struct {
	mu         sync.Mutex
	maxEntries int
	maxBytes   int64
	bytes      int64
	order      *list.List // front: most recent
	items      map[string]*list.Element
}

type lruEntry struct {
	key string
	a   Answer
}

func newLRU(entries int, bytes int64) *lru {
	return &lru{maxEntries: entries, maxBytes: bytes, order: list.New(), items: map[string]*list.Element{}}
}

func (c *lru) get(key string) (Answer, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.items[key]
	if !ok {
		return Answer{}, false
	}
	c.order.MoveToFront(e)
	return e.Value.(*lruEntry).a, true
}

func cost(key string, a Answer) int64 { return int64(len(key) + len(a.Doc)) }

// put adds an answer; one larger than the whole cache is not kept.
func (c *lru) put(key string, a Answer) {
	n := cost(key, a)
	if n > c.maxBytes {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.items[key]; ok {
		c.bytes -= cost(key, e.Value.(*lruEntry).a)
		e.Value.(*lruEntry).a = a
		c.bytes += n
		c.order.MoveToFront(e)
	} else {
		c.items[key] = c.order.PushFront(&lruEntry{key, a})
		c.bytes += n
	}
	for c.order.Len() > c.maxEntries || c.bytes > c.maxBytes {
		e := c.order.Back()
		le := e.Value.(*lruEntry)
		c.order.Remove(e)
		delete(c.items, le.key)
		c.bytes -= cost(le.key, le.a)
	}
}

func (c *lru) size() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bytes
}
