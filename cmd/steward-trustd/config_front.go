package main

import (
	"strconv"
	"strings"
	"time"
)

// loadFrontDoor reads the front door's eviction and lease settings;
// unset ones stay zero and take server.ConnLimits' defaults.
func loadFrontDoor(c *config, get lookup) error {
	l := &c.conns
	err := firstErr(
		intInto(get, "max-authenticated-per-prefix", &l.MaxAuthenticatedPerPrefix),
		prefixesInto(get, "connection-prefixes-v4", 32, &l.PrefixesV4),
		prefixesInto(get, "connection-prefixes-v6", 128, &l.PrefixesV6),
		intInto(get, "known-worker-reserve", &l.KnownWorkerReserve),
		durationInto(get, "known-worker-ttl", 0, &l.KnownWorkerTTL),
		durationInto(get, "eviction-grace", 0, &l.EvictionGrace),
		deferAcceptInto(get, &l.DeferAccept),
		durationInto(get, "request-idle-timeout", 0, &l.RequestIdleTimeout),
	)
	if err == nil && l.MaxUnauthenticated > 0 && l.KnownWorkerReserve >= l.MaxUnauthenticated {
		err = bad("known-worker-reserve", "%d must be below TRUSTD_MAX_UNAUTHENTICATED_CONNECTIONS (%d)", l.KnownWorkerReserve, l.MaxUnauthenticated)
	}
	auth := l.AuthTimeout
	if auth == 0 {
		auth = 10 * time.Second // server.ConnLimits' default
	}
	if err == nil && l.RequestIdleTimeout >= auth {
		err = bad("request-idle-timeout", "%v must be below TRUSTD_AUTH_TIMEOUT (%v): a served connection is closed sooner than an unauthenticated one", l.RequestIdleTimeout, auth)
	}
	return err
}

// prefixesInto reads comma-separated prefix lengths in 1..bits.
func prefixesInto(get lookup, name string, bits int, dst *[]int) error {
	v, ok := get(name)
	if !ok || v == "" {
		return nil
	}
	out := []int{}
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n >= bits {
			return bad(name, "%q is not a comma-separated list of prefix lengths below %d", v, bits)
		}
		out = append(out, n)
	}
	*dst = out
	return nil
}

// deferAcceptInto reads TRUSTD_DEFER_ACCEPT: a duration of whole seconds
// (the kernel's unit), or "off".
func deferAcceptInto(get lookup, dst *time.Duration) error {
	v, ok := get("defer-accept")
	switch {
	case !ok || v == "":
		return nil
	case v == "off":
		*dst = -1
		return nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < time.Second || d > time.Minute {
		return bad("defer-accept", "%q is not a duration of 1s to 1m, or off", v)
	}
	*dst = d
	return nil
}
