package memstore

// expiry is a record's place in the store's expiry queue: the key and the
// expiry it had when it was queued.
type expiry struct {
	at int64 // Unix nanoseconds on the store's clock
	k  recordKey
}

// expiryQueue is a min-heap of the records' expiries, soonest first, so
// that a full store finds its expired records without reading the live
// ones: a claim on a full store with nothing expired costs one look at
// the head instead of a pass over every record. A record whose expiry
// changes is queued again; its old place is dropped when it comes up
// (see evictExpired). It is typed rather than a container/heap, whose
// Push would allocate an interface for every claim.
type expiryQueue []expiry

func (q *expiryQueue) push(x expiry) {
	*q = append(*q, x)
	h := *q
	for i := len(h) - 1; i > 0; {
		parent := (i - 1) / 2
		if h[parent].at <= h[i].at {
			break
		}
		h[parent], h[i] = h[i], h[parent]
		i = parent
	}
}

// pop removes and returns the soonest expiry; q must not be empty.
func (q *expiryQueue) pop() expiry {
	h := *q
	top := h[0]
	last := len(h) - 1
	h[0] = h[last]
	h[last] = expiry{} // let the key's strings go
	h = h[:last]
	h.down(0)
	*q = h
	return top
}

// down moves h[i] down to its place.
func (h expiryQueue) down(i int) {
	for {
		small, l, r := i, 2*i+1, 2*i+2
		if l < len(h) && h[l].at < h[small].at {
			small = l
		}
		if r < len(h) && h[r].at < h[small].at {
			small = r
		}
		if small == i {
			return
		}
		h[i], h[small] = h[small], h[i]
		i = small
	}
}

// staleSlack is how many places of records that are gone or were queued
// again the queue may hold beyond one per record before it is rebuilt.
const staleSlack = 1024

// rebuild replaces the queue with one place per record in records: the
// places left behind by records that were claimed again with another
// expiry, or removed, go. A key claimed, released and claimed again
// leaves a place each time, which would otherwise stay until its old
// expiry came up: a day's worth of places for a record that is one.
func (q *expiryQueue) rebuild(records map[recordKey]entry) {
	h := (*q)[:0]
	for k, e := range records {
		h = append(h, expiry{at: e.expires, k: k})
	}
	clear(h[len(h):cap(h)]) // let the dropped keys' strings go
	for i := len(h)/2 - 1; i >= 0; i-- {
		h.down(i)
	}
	*q = h
}
