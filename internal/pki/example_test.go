package pki_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"fmt"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/pki"
)

// An OS CA certificate with Talos's profile, and a serving certificate it
// issues: IP addresses become IP SANs, names DNS SANs.
func ExampleNewCACertificate() {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		fmt.Println(err)
		return
	}
	now := time.Now()
	ca, err := pki.NewCACertificate(key, pki.CAOptions{Cluster: "prod"}, now, rand.Reader)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(ca.Subject, ca.IsCA, pki.AllowsClientAuth(ca))
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		fmt.Println(err)
		return
	}
	srv, err := pki.NewServingCertificate(ca, key, srvKey.Public(), []string{"trustd.example", "10.0.0.5"}, 0, now, rand.Reader)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(srv.DNSNames, srv.IPAddresses)
	// Output:
	// CN=prod,O=talos true true
	// [trustd.example] [10.0.0.5]
}

// Fingerprints are read as people copy them (colons, any case) and
// printed as CertFingerprint prints them.
func ExampleParseFingerprint() {
	fp, err := pki.ParseFingerprint("AB:CD:EF:01:23:45:67:89:AB:CD:EF:01:23:45:67:89:AB:CD:EF:01:23:45:67:89:AB:CD:EF:01:23:45:67:89")
	fmt.Println(fp, err)
	_, err = pki.ParseFingerprint("abcdef")
	fmt.Println(err)
	// Output:
	// abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789 <nil>
	// "abcdef" is not a SHA-256 fingerprint (64 hex digits)
}

// A worker may ask for node names with '_' and a trailing dot; trustd's
// own names follow RFC 1123, and neither rule allows wildcards.
func ExampleCheckDNSName() {
	fmt.Println(pki.CheckDNSName("node_1.cluster.local.", pki.WorkerName) == nil)
	fmt.Println(pki.CheckDNSName("node_1.cluster.local.", pki.OwnName) == nil)
	fmt.Println(pki.CheckDNSName("*.cluster.local", pki.WorkerName) == nil)
	// Output:
	// true
	// false
	// false
}
