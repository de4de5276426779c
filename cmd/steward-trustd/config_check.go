package main

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/signer/file"
)

// checkConfig applies the rules between settings and the defaults that
// follow from other settings; the first broken rule is reported.
func checkConfig(c *config) error {
	for _, check := range []func(*config) error{checkCredentials, checkSigner, checkConns, checkLog, checkAuthorizer} {
		if err := check(c); err != nil {
			return err
		}
	}
	return nil
}

func checkCredentials(c *config) error {
	if c.issuerFile != "" && c.issuer != nil {
		return c.bad("issuer-crt-file", "an issuer chain file contradicts TRUSTD_ISSUER_CRT; use one or the other")
	}
	if (c.srvCrt == nil) != (c.srvKey == nil) {
		return c.bad("server-key", "the serving certificate and key must be given together (TRUSTD_SERVER_CRT and TRUSTD_SERVER_KEY)")
	}
	return nil
}

// checkSigner refuses two OS CA keys and defaults to the cert dir's file.
func checkSigner(c *config) error {
	switch {
	case c.signer != "" && c.inlineCA != nil:
		scheme, _, _ := strings.Cut(c.signer, ":")
		return c.bad("os-ca-key", "an inline OS CA key contradicts TRUSTD_SIGNER=%s:...; use one or the other", scheme)
	case c.signer == "" && c.inlineCA == nil:
		c.signer = file.URI(filepath.Join(c.certDir, certdir.FileCAKey))
	}
	return nil
}

// checkConns keeps the connection budgets nested: unauthenticated within
// the total, the known-worker reserve within the unauthenticated, and a
// served connection closed sooner than an unauthenticated one.
func checkConns(c *config) error {
	l := &c.conns
	switch {
	case l.MaxUnauthenticated > l.MaxConnections:
		return c.bad("max-unauthenticated-connections", "%d exceeds TRUSTD_MAX_CONNECTIONS (%d)", l.MaxUnauthenticated, l.MaxConnections)
	case l.MaxUnauthenticated > 0 && l.KnownWorkerReserve >= l.MaxUnauthenticated:
		return c.bad("known-worker-reserve", "%d must be below TRUSTD_MAX_UNAUTHENTICATED_CONNECTIONS (%d)", l.KnownWorkerReserve, l.MaxUnauthenticated)
	case l.RequestIdleTimeout >= l.AuthTimeout:
		return c.bad("request-idle-timeout", "%v must be below TRUSTD_AUTH_TIMEOUT (%v): a served connection is closed sooner than an unauthenticated one", l.RequestIdleTimeout, l.AuthTimeout)
	}
	return nil
}

// bad is a configError for the setting with this flag name.
func (c *config) bad(flag, format string, args ...any) error {
	for _, s := range c.settings() {
		if s.flag == flag {
			return &configError{setting: s, msg: fmt.Sprintf(format, args...)}
		}
	}
	return &configError{setting: setting{flag: flag}, msg: fmt.Sprintf(format, args...)}
}
