package allocator

// itemTree is a B+ tree of setItems, the ordered set under a blockSet: the
// leaves hold the items in order and are linked both ways, so a walk from a
// lower bound (get_free_block's, release_available_cached_blocks') moves
// along a leaf and then to the next without another search; an inner node
// holds its children and, between each two, a separator: every item of
// kids[i] sorts before items[i], every item of kids[i+1] not before it.
//
// It replaced github.com/google/btree: that B-tree compares through a
// function value inside sort.Search's closure, and the searches were most
// of the replay's time; here the comparison (itemLess) inlines into them.
type itemTree struct {
	root *treeNode
	n    int
}

// treeNode is a leaf (kids nil: items are the items) or an inner node
// (items are the separators, one fewer than kids).
type treeNode struct {
	items      []setItem
	kids       []*treeNode
	prev, next *treeNode // the neighbouring leaves
}

// treeMax is the most items of a leaf and children of an inner node; a
// node other than the root keeps at least treeMax/2. Three interleaved
// runs of BenchmarkReplayProgramQwen3_30B_A3B and …DeepSeekV2 each on this
// project's busy 2-core host: 16 took 262-269 and 548-627 ms, 32 228-308 and
// 497-532 ms, 64 251-279 and 451-550 ms (with 40-byte items, 16 to 128
// were all within the noise).
const treeMax = 32

func newLeaf() *treeNode { return &treeNode{items: make([]setItem, 0, treeMax+1)} }

func (n *treeNode) leaf() bool { return n.kids == nil }

// lowerIndex is the first index of items not before k.
func lowerIndex(items []setItem, k setItem) int {
	lo, hi := 0, len(items)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if itemLess(items[m], k) {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

// upperIndex is the first index of items after k: in an inner node, the
// child whose range holds k.
func upperIndex(items []setItem, k setItem) int {
	lo, hi := 0, len(items)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if itemLess(k, items[m]) {
			hi = m
		} else {
			lo = m + 1
		}
	}
	return lo
}

// treeCursor is a place in the leaves: items[i] of leaf n (n nil: past the
// end).
type treeCursor struct {
	n *treeNode
	i int
}

func (c treeCursor) valid() bool   { return c.n != nil }
func (c treeCursor) item() setItem { return c.n.items[c.i] }
func (c *treeCursor) forward() {
	if c.i++; c.i >= len(c.n.items) {
		c.n, c.i = c.n.next, 0
		c.settle()
	}
}

func (c *treeCursor) backward() {
	if c.i--; c.i < 0 {
		c.n = c.n.prev
		for c.n != nil && len(c.n.items) == 0 {
			c.n = c.n.prev
		}
		if c.n != nil {
			c.i = len(c.n.items) - 1
		}
	}
}

// settle moves a cursor at a leaf's end to the next item.
func (c *treeCursor) settle() {
	for c.n != nil && c.i >= len(c.n.items) {
		c.n, c.i = c.n.next, 0
	}
}

// seek is the cursor at the first item not before k.
func (t *itemTree) seek(k setItem) treeCursor {
	n := t.root
	if n == nil {
		return treeCursor{}
	}
	for !n.leaf() {
		n = n.kids[upperIndex(n.items, k)]
	}
	c := treeCursor{n, lowerIndex(n.items, k)}
	c.settle()
	return c
}

// first is the cursor at the first item.
func (t *itemTree) first() treeCursor {
	n := t.root
	if n == nil {
		return treeCursor{}
	}
	for !n.leaf() {
		n = n.kids[0]
	}
	c := treeCursor{n, 0}
	c.settle()
	return c
}

// before is the cursor at the last item before k.
func (t *itemTree) before(k setItem) treeCursor {
	c := t.seek(k)
	if c.valid() {
		c.backward()
		return c
	}
	n := t.root
	if n == nil {
		return c
	}
	for !n.leaf() {
		n = n.kids[len(n.kids)-1]
	}
	c = treeCursor{n, len(n.items)}
	c.backward()
	return c
}

// insert adds it, which must not be in the tree.
func (t *itemTree) insert(it setItem) {
	if t.root == nil {
		t.root = newLeaf()
	}
	t.n++
	if sep, right := t.root.insert(it); right != nil {
		t.root = &treeNode{items: append(make([]setItem, 0, treeMax+1), sep), kids: append(make([]*treeNode, 0, treeMax+1), t.root, right)}
	}
}

// insert adds it under n; when n splits, the new right half and the
// separator before it.
func (n *treeNode) insert(it setItem) (setItem, *treeNode) {
	if n.leaf() {
		i := lowerIndex(n.items, it)
		n.items = append(n.items, setItem{})
		copy(n.items[i+1:], n.items[i:])
		n.items[i] = it
		if len(n.items) > treeMax {
			return n.splitLeaf()
		}
		return setItem{}, nil
	}
	j := upperIndex(n.items, it)
	sep, right := n.kids[j].insert(it)
	if right == nil {
		return setItem{}, nil
	}
	n.items = insertAt(n.items, j, sep)
	n.kids = insertAt(n.kids, j+1, right)
	if len(n.kids) > treeMax {
		return n.splitInner()
	}
	return setItem{}, nil
}

func insertAt[T any](s []T, i int, v T) []T {
	var zero T
	s = append(s, zero)
	copy(s[i+1:], s[i:])
	s[i] = v
	return s
}

func removeAt[T any](s []T, i int) []T {
	copy(s[i:], s[i+1:])
	var zero T
	s[len(s)-1] = zero
	return s[:len(s)-1]
}

func (n *treeNode) splitLeaf() (setItem, *treeNode) {
	h := len(n.items) / 2
	r := newLeaf()
	r.items = append(r.items, n.items[h:]...)
	n.items = n.items[:h]
	r.prev, r.next = n, n.next
	if n.next != nil {
		n.next.prev = r
	}
	n.next = r
	return r.items[0], r
}

func (n *treeNode) splitInner() (setItem, *treeNode) {
	h := len(n.kids) / 2 // kids[:h] stay, separator items[h-1] goes up
	r := &treeNode{items: make([]setItem, 0, treeMax+1), kids: make([]*treeNode, 0, treeMax+1)}
	sep := n.items[h-1]
	r.items = append(r.items, n.items[h:]...)
	r.kids = append(r.kids, n.kids[h:]...)
	clear(n.kids[h:])
	n.items, n.kids = n.items[:h-1], n.kids[:h]
	return sep, r
}

// size is a node's items (leaf) or children (inner node).
func (n *treeNode) size() int {
	if n.leaf() {
		return len(n.items)
	}
	return len(n.kids)
}

// remove erases it; false when it is not in the tree.
func (t *itemTree) remove(it setItem) bool {
	if t.root == nil || !t.root.remove(it) {
		return false
	}
	t.n--
	if !t.root.leaf() && len(t.root.kids) == 1 {
		t.root = t.root.kids[0]
	}
	return true
}

// removeAt erases it where c points, when c points at it and its leaf
// keeps enough items without it (the separators above stay valid); false
// otherwise.
func (t *itemTree) removeAt(c treeCursor, it setItem) bool {
	if !c.valid() || c.item() != it || len(c.n.items) <= treeMax/2 && c.n != t.root {
		return false
	}
	c.n.items = removeAt(c.n.items, c.i)
	t.n--
	return true
}

// remove erases it under n, then mends the child it left too small.
func (n *treeNode) remove(it setItem) bool {
	if n.leaf() {
		i := lowerIndex(n.items, it)
		if i == len(n.items) || n.items[i] != it {
			return false
		}
		n.items = removeAt(n.items, i)
		return true
	}
	j := upperIndex(n.items, it)
	if !n.kids[j].remove(it) {
		return false
	}
	if n.kids[j].size() < treeMax/2 {
		n.mend(j)
	}
	return true
}

// mend refills child j from a sibling with more than the least, or merges
// it with one.
func (n *treeNode) mend(j int) {
	switch {
	case j > 0 && n.kids[j-1].size() > treeMax/2:
		n.borrowLeft(j)
	case j+1 < len(n.kids) && n.kids[j+1].size() > treeMax/2:
		n.borrowRight(j)
	case j > 0:
		n.merge(j - 1)
	default:
		n.merge(j)
	}
}

// borrowLeft moves child j-1's last item (or child) to child j.
func (n *treeNode) borrowLeft(j int) {
	l, c := n.kids[j-1], n.kids[j]
	if c.leaf() {
		c.items = insertAt(c.items, 0, l.items[len(l.items)-1])
		l.items = l.items[:len(l.items)-1]
		n.items[j-1] = c.items[0]
		return
	}
	c.items = insertAt(c.items, 0, n.items[j-1])
	c.kids = insertAt(c.kids, 0, l.kids[len(l.kids)-1])
	n.items[j-1] = l.items[len(l.items)-1]
	l.items = l.items[:len(l.items)-1]
	l.kids[len(l.kids)-1] = nil
	l.kids = l.kids[:len(l.kids)-1]
}

// borrowRight moves child j+1's first item (or child) to child j.
func (n *treeNode) borrowRight(j int) {
	c, r := n.kids[j], n.kids[j+1]
	if c.leaf() {
		c.items = append(c.items, r.items[0])
		r.items = removeAt(r.items, 0)
		n.items[j] = r.items[0]
		return
	}
	c.items = append(c.items, n.items[j])
	c.kids = append(c.kids, r.kids[0])
	n.items[j] = r.items[0]
	r.items = removeAt(r.items, 0)
	r.kids = removeAt(r.kids, 0)
}

// merge joins child i+1 into child i.
func (n *treeNode) merge(i int) {
	l, r := n.kids[i], n.kids[i+1]
	if l.leaf() {
		l.items = append(l.items, r.items...)
		l.next = r.next
		if r.next != nil {
			r.next.prev = l
		}
	} else {
		l.items = append(append(l.items, n.items[i]), r.items...)
		l.kids = append(l.kids, r.kids...)
	}
	n.items = removeAt(n.items, i)
	n.kids = removeAt(n.kids, i+1)
}
