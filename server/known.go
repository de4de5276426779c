package server

import (
	"container/list"
	"net/netip"
	"time"
)

// knownWorkers remembers the addresses whose requests recently passed the
// token and the request checks, so that their next connections keep a
// reserved share of the unauthenticated budget: a flood from unknown
// addresses cannot starve the fleet's renewals. Bounded in entries (the
// least recently seen is forgotten first) and in age.
type knownWorkers struct {
	max   int
	ttl   time.Duration
	order *list.List // of *knownEntry, least recently seen first
	addrs map[netip.Addr]*list.Element
}

type knownEntry struct {
	addr netip.Addr
	seen time.Time
}

func newKnownWorkers(maxEntries int, ttl time.Duration) *knownWorkers {
	return &knownWorkers{max: maxEntries, ttl: ttl, order: list.New(), addrs: map[netip.Addr]*list.Element{}}
}

// add records that a passed a request at now.
func (k *knownWorkers) add(a netip.Addr, now time.Time) {
	if e, ok := k.addrs[a]; ok {
		e.Value.(*knownEntry).seen = now
		k.order.MoveToBack(e)
		return
	}
	if k.order.Len() >= k.max {
		oldest := k.order.Front()
		delete(k.addrs, oldest.Value.(*knownEntry).addr)
		k.order.Remove(oldest)
	}
	k.addrs[a] = k.order.PushBack(&knownEntry{addr: a, seen: now})
}

// has reports whether a passed a request within the TTL.
func (k *knownWorkers) has(a netip.Addr, now time.Time) bool {
	e, ok := k.addrs[a]
	return ok && now.Sub(e.Value.(*knownEntry).seen) < k.ttl
}
