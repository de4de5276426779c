package keystore

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/pki"
	"github.com/steward-trustd/steward-trustd/signer"
)

// RotateOptions configures Rotate.
type RotateOptions struct {
	// NewSignerURI is where the new CA key is created.
	NewSignerURI string
	// Algorithm of the new key; empty means signer.ECDSAP256.
	Algorithm signer.Algorithm
	// Validity of the new CA; zero means pki.DefaultCAValidity.
	Validity time.Duration
}

// Rotate starts a CA rotation in the ceremony directory d: it creates a
// new key on the device, self-signs a new CA with the current CA's subject
// into os-ca.next.crt and adds it to accepted-cas.crt. os-ca.crt stays the
// issuing CA, so the daemon keeps signing with the old key and every
// existing worker and talosctl keeps working, while the `ca` bundle the
// daemon returns (os-ca.crt + accepted-cas.crt) now also lets in talosctl
// certificates signed by the new CA. The worker patch gains
// machine.acceptedCAs with the new CA. Finish with RotateFinish.
func (c *Ceremony) Rotate(ctx context.Context, d Dir, o RotateOptions) (*Outcome, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	if o.Algorithm == "" {
		o.Algorithm = signer.ECDSAP256
	}
	cur, token, err := currentCA(d)
	if err != nil {
		return nil, fmt.Errorf("rotate: %w", err)
	}
	nextData, err := readOptional(d, certdir.FileNextCACert)
	if err != nil {
		return nil, err
	}
	out := &Outcome{}
	var next *x509.Certificate
	if nextData != nil {
		if next, err = pki.ParseCertificate(nextData); err != nil {
			return nil, fmt.Errorf("rotate: %s: %w", d.Path(certdir.FileNextCACert), err)
		}
		// Only the key of that rotation may continue it.
		s, err := c.Keys.Open(ctx, o.NewSignerURI)
		if err != nil || !pki.KeyMatchesCert(s.Public(), next) {
			if s != nil {
				s.Close()
			}
			return nil, fmt.Errorf("rotate: a rotation to CA %s is already in progress (%s) with another key; finish it with `rotate --finish` first", pki.CertFingerprint(next), d.Path(certdir.FileNextCACert))
		}
		s.Close()
	}
	key, resumedKey, err := c.generateOrResume(ctx, d, o.NewSignerURI, o.Algorithm, "rotate.key")
	if err != nil {
		return nil, fmt.Errorf("rotate: %w", err)
	}
	defer key.Close()
	if resumedKey {
		out.Resumed = append(out.Resumed, "the new key was created by an earlier run")
	}
	if next == nil {
		org := "talos"
		if len(cur.Subject.Organization) > 0 {
			org = cur.Subject.Organization[0]
		}
		next, err = pki.NewCACertificate(key, pki.CAOptions{Cluster: cur.Subject.CommonName, Organization: org, Validity: o.Validity}, c.now(), c.Rand)
		if err != nil {
			return nil, fmt.Errorf("rotate: self-sign the new CA through the device: %w", err)
		}
	} else {
		out.Resumed = append(out.Resumed, d.Path(certdir.FileNextCACert)+" was already issued")
	}
	acc, err := readAccepted(d)
	if err != nil {
		return nil, err
	}
	accepted := dedupe(append(without(acc, cur), next))
	server, err := serverFiles(d)
	if err != nil {
		return nil, err
	}
	files, err := clusterFiles(secretCluster(cur), cur, accepted, token, server)
	if err != nil {
		return nil, err
	}
	files = append([]File{{Name: certdir.FileNextCACert, Data: pki.EncodeCertificates(next), Mode: 0o644}}, files...)
	r := newReceipt("rotate", c.Version, c.now(), key.Describe())
	certReceipt(&r, next)
	r.Files = fileNames(files)
	r.Details = map[string]string{"currentCAFingerprint": pki.CertFingerprint(cur)}
	rf, err := receiptFile(d, r, c.Rand)
	if err != nil {
		return nil, err
	}
	if err := WriteSet(d, append(files, rf), true); err != nil {
		return nil, fmt.Errorf("rotate: %w", err)
	}
	out.Receipt = r
	out.Written = paths(d, append(files, rf))
	out.Notes = append(out.Notes,
		"1. deploy the updated "+d.Path(certdir.FileKubernetesSecret)+" (or copy "+certdir.FileAcceptedCAs+" into the daemon's cert dir) and restart steward-trustd: it still signs with the old key",
		"2. apply "+d.Path(certdir.FileWorkerPatch)+" to every worker (adds machine.acceptedCAs); workers pick up the new client-CA bundle at their next certificate renewal (12 h, or on reboot)",
		"3. issue new talosconfigs with --signer <new key URI> --ca "+d.Path(certdir.FileNextCACert)+"; they trust both CAs",
		"4. when every worker and user has moved, run `rotate --finish`")
	return out, nil
}

// RotateFinishOptions configures RotateFinish.
type RotateFinishOptions struct {
	// NewSignerURI is the key of os-ca.next.crt.
	NewSignerURI string
	// ServerValidity of the re-issued serving certificate.
	ServerValidity time.Duration
}

// RotateFinish ends a rotation: os-ca.next.crt becomes os-ca.crt, the old
// CA leaves accepted-cas.crt (and with it the `ca` bundle, so old-CA
// talosctl certificates stop working), server.crt is re-issued by the new
// CA for the same names if present, and the worker patch drops the old CA.
func (c *Ceremony) RotateFinish(ctx context.Context, d Dir, o RotateFinishOptions) (*Outcome, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	old, token, err := currentCA(d)
	if err != nil {
		return nil, fmt.Errorf("rotate --finish: %w", err)
	}
	nextData, err := readOptional(d, certdir.FileNextCACert)
	if err != nil {
		return nil, err
	}
	if nextData == nil {
		return nil, fmt.Errorf("rotate --finish: no rotation in progress (%s is missing)", d.Path(certdir.FileNextCACert))
	}
	next, err := pki.ParseCertificate(nextData)
	if err != nil {
		return nil, fmt.Errorf("rotate --finish: %s: %w", d.Path(certdir.FileNextCACert), err)
	}
	key, err := c.OpenCA(ctx, o.NewSignerURI, next)
	if err != nil {
		return nil, fmt.Errorf("rotate --finish: %w", err)
	}
	defer key.Close()
	if err := VerifyDeviceSignature(key, next.PublicKey, c.Rand); err != nil {
		return nil, fmt.Errorf("rotate --finish: %w", err)
	}
	acc, err := readAccepted(d)
	if err != nil {
		return nil, err
	}
	accepted := without(acc, old, next)
	server, err := serverFiles(d)
	if err != nil {
		return nil, err
	}
	var serverOut []File
	if server != nil {
		prev, err := pki.ParseCertificate(server[certdir.FileServerCert])
		if err != nil {
			return nil, fmt.Errorf("rotate --finish: %s: %w", d.Path(certdir.FileServerCert), err)
		}
		hosts := append([]string{}, prev.DNSNames...)
		for _, ip := range prev.IPAddresses {
			hosts = append(hosts, ip.String())
		}
		crt, keyPEM, err := issueServing(next, key, hosts, o.ServerValidity, c.now(), c.Rand)
		if err != nil {
			return nil, fmt.Errorf("rotate --finish: re-issue %s: %w", certdir.FileServerCert, err)
		}
		server = map[string][]byte{certdir.FileServerCert: pki.EncodeCertificates(crt), certdir.FileServerKey: keyPEM}
		serverOut = []File{
			{Name: certdir.FileServerKey, Data: keyPEM, Mode: 0o600},
			{Name: certdir.FileServerCert, Data: server[certdir.FileServerCert], Mode: 0o600},
		}
	}
	files, err := clusterFiles(secretCluster(old), next, accepted, token, server)
	if err != nil {
		return nil, err
	}
	files = append(append(serverOut, files...), File{Name: certdir.FileNextCACert, Remove: true})
	r := newReceipt("rotate.finish", c.Version, c.now(), key.Describe())
	certReceipt(&r, next)
	r.Files = fileNames(files)
	r.Details = map[string]string{"retiredCAFingerprint": pki.CertFingerprint(old)}
	rf, err := receiptFile(d, r, c.Rand)
	if err != nil {
		return nil, err
	}
	if err := WriteSet(d, append(files, rf), true); err != nil {
		return nil, fmt.Errorf("rotate --finish: %w", err)
	}
	return &Outcome{Receipt: r, Written: paths(d, append(files, rf)), Notes: []string{
		"restart steward-trustd with TRUSTD_SIGNER set to the new key URI and the updated " + d.Path(certdir.FileKubernetesSecret),
		"apply " + d.Path(certdir.FileWorkerPatch) + " to every worker (machine.ca is now the new CA)",
		"talosconfigs signed by the old CA stop working once workers renew their certificates; the old key can then be destroyed on the device",
	}}, nil
}

// currentCA reads os-ca.crt and token from d.
func currentCA(d Dir) (*x509.Certificate, string, error) {
	data, err := d.ReadFile(certdir.FileCACert)
	if err != nil {
		return nil, "", fmt.Errorf("read the current CA: %w (run init or import first)", err)
	}
	ca, err := pki.ParseCertificate(data)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", d.Path(certdir.FileCACert), err)
	}
	tok, err := d.ReadFile(certdir.FileToken)
	if err != nil {
		return nil, "", fmt.Errorf("read the worker token: %w", err)
	}
	token := strings.TrimSpace(string(tok))
	if token == "" {
		return nil, "", errors.New(d.Path(certdir.FileToken) + " is empty")
	}
	return ca, token, nil
}

func secretCluster(ca *x509.Certificate) string {
	if ca.Subject.CommonName != "" {
		return ca.Subject.CommonName
	}
	return "talos"
}
