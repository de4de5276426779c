package keystore

// Attested enrolment of a node's intermediate (issue 13): the node's
// request carries TPM evidence that its key lives in that TPM; the root
// verifies it before signing and seals the certificate to the node's EK
// and AK; the node installs it with TPM2_ActivateCredential.

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"

	"github.com/steward-trustd/steward-trustd/internal/attestation"
	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/pki"
	"github.com/steward-trustd/steward-trustd/signer"
)

// Receipt operations of attested enrolment.
const (
	opIntermediateAttest  = "intermediate.attest"
	opIntermediateEnrol   = "intermediate.enrol"
	opIntermediateInstall = "intermediate.install"
)

// IntermediateAttestOptions configures IntermediateAttest.
type IntermediateAttestOptions struct {
	// SignerURI is the node's TPM key (tpm:path=…), CSR its PEM request.
	SignerURI string
	CSR       []byte
	TPM       Attester
	// Out receives the attested request (replaced if present: it can be
	// made again from the key).
	Out Target
}

// IntermediateAttest writes the attested request for a CSR made by
// IntermediateRequest: the CSR and a TPM2_CertifyCreation of its key
// with SHA-256 of the CSR as qualifying data.
func (c *Ceremony) IntermediateAttest(ctx context.Context, d Dir, o IntermediateAttestOptions) (*Outcome, error) {
	csr, err := pki.ParseCSR(o.CSR, 0)
	if err == nil {
		err = replaceable(o.Out, "an attested request", func(b []byte) bool { _, err := attestation.ParseRequest(b); return err == nil })
	}
	if err != nil {
		return nil, fmt.Errorf("intermediate request --attest: %w", err)
	}
	ev, err := o.TPM.Attest(ctx, o.SignerURI, attestation.CSRQualifyingData(csr.Raw))
	if err != nil {
		return nil, fmt.Errorf("intermediate request --attest: %w", err)
	}
	data, err := marshalJSON(attestation.Request{Version: attestation.RequestVersion, CSR: csr.Raw, Evidence: ev})
	if err != nil {
		return nil, err
	}
	r := Receipt{Operation: opIntermediateAttest, Backend: "tpm", Details: map[string]string{"name": csr.Subject.CommonName}}
	r.KeyFingerprint, _ = signer.Fingerprint(csr.PublicKey)
	return c.commitRecord(d, r, []Placed{{Dir: o.Out.Dir, File: File{Name: o.Out.Name, Data: data, Mode: 0o644}, Overwrite: true}})
}

// AttestedSign is what IntermediateSignAttested verifies.
type AttestedSign struct {
	// Request is the attested request file.
	Request []byte
	// Expect holds the EK roots and the expected policy; QualifyingData
	// and PublicKey are taken from the request's CSR.
	Expect attestation.Options
}

// IntermediateSignAttested verifies an attested request (every check of
// attestation.Verify) and only then signs the intermediate as
// IntermediateSign does; o.Out receives it sealed to the node's EK and
// AK, so only that TPM can install it. A refusal writes nothing but its
// receipt.
func (c *Ceremony) IntermediateSignAttested(ctx context.Context, receipts Dir, o IntermediateSignOptions, a AttestedSign) (*x509.Certificate, *Outcome, error) {
	req, res, details, err := verifyRequest(a)
	if err != nil {
		return nil, nil, c.refusal(receipts, opIntermediateEnrol, details, fmt.Errorf("intermediate sign: %w", err))
	}
	o.CSR = pki.EncodeCSR(req.CSR)
	cert, root, err := c.signIntermediate(ctx, o)
	if err != nil {
		return nil, nil, err
	}
	sealed, err := attestation.Seal(c.Rand, req.Evidence, pki.EncodeCertificates(cert))
	if err != nil {
		return nil, nil, fmt.Errorf("intermediate sign: %w", err)
	}
	data, err := sealed.Marshal()
	if err != nil {
		return nil, nil, err
	}
	is := planIntermediateSign(root, cert, o)
	is.op, is.outputs[0].File.Data = opIntermediateEnrol, data
	for k, v := range details {
		is.details[k] = v
	}
	is.details["outcome"], is.details["attestation"] = "authorized", "attested: key in the TPM of EK "+res.EK.SHA256
	out, err := c.commitIssue(receipts, is)
	if err != nil {
		return nil, nil, fmt.Errorf("intermediate sign: %w", err)
	}
	out.Notes = []string{"give " + o.Out.Dir.Path(o.Out.Name) + " to the node: `steward-trustd-ceremony intermediate install --signer TPM_URI --in FILE --out issuer.crt` (only its TPM can open it)"}
	return cert, out, nil
}

// verifyRequest decodes and verifies an attested request.
func verifyRequest(a AttestedSign) (*attestation.Request, *attestation.Result, map[string]string, error) {
	details := map[string]string{}
	req, err := attestation.ParseRequest(a.Request)
	if err != nil {
		return nil, nil, details, err
	}
	csr, err := x509.ParseCertificateRequest(req.CSR)
	if err == nil {
		err = csr.CheckSignature()
	}
	if err != nil {
		return nil, nil, details, fmt.Errorf("the request's CSR: %w", err)
	}
	details["name"] = csr.Subject.CommonName
	exp := a.Expect
	exp.QualifyingData, exp.PublicKey = attestation.CSRQualifyingData(req.CSR), csr.PublicKey
	res, err := attestation.Verify(req.Evidence, exp)
	if err != nil {
		return nil, nil, details, err
	}
	details["ekCertificate"], details["ekRoot"] = res.EK.SHA256, res.EK.Root
	details["akName"], details["keyName"], details["policy"] = res.AKName, res.KeyName, res.Policy
	return req, res, details, nil
}

// IntermediateInstallOptions configures IntermediateInstall.
type IntermediateInstallOptions struct {
	// SignerURI is the node's intermediate key.
	SignerURI string
	TPM       Attester
	// Sealed is the file intermediate sign --ek-roots wrote.
	Sealed []byte
	// Out receives issuer.crt; Force allows replacing it.
	Out   Target
	Force bool
}

// IntermediateInstall opens a sealed intermediate with
// TPM2_ActivateCredential, checks that it certifies the key at
// SignerURI and writes it. A failure leaves a receipt.
func (c *Ceremony) IntermediateInstall(ctx context.Context, d Dir, o IntermediateInstallOptions) (*x509.Certificate, *Outcome, error) {
	cert, desc, err := c.openSealedIntermediate(ctx, o)
	if err != nil {
		return nil, nil, c.refusal(d, opIntermediateInstall, map[string]string{}, fmt.Errorf("intermediate install: %w", err))
	}
	r := newReceipt(opIntermediateInstall, "", c.now(), desc)
	certReceipt(&r, cert)
	r.Details = map[string]string{"outcome": "installed"}
	out, err := c.commitRecord(d, r, []Placed{{Dir: o.Out.Dir, File: File{Name: o.Out.Name, Data: pki.EncodeCertificates(cert), Mode: 0o644}, Overwrite: o.Force}})
	if err != nil {
		return nil, nil, fmt.Errorf("intermediate install: %w", err)
	}
	return cert, out, nil
}

func (c *Ceremony) openSealedIntermediate(ctx context.Context, o IntermediateInstallOptions) (*x509.Certificate, signer.Description, error) {
	sealed, err := attestation.ParseSealed(o.Sealed)
	if err != nil {
		return nil, signer.Description{}, err
	}
	payload, err := o.TPM.ActivateCredential(ctx, o.SignerURI, sealed)
	if err != nil {
		return nil, signer.Description{}, err
	}
	certs, err := pki.ParseCertificates(payload)
	if err != nil || len(certs) == 0 {
		return nil, signer.Description{}, errors.Join(errors.New("the sealed payload holds no certificate"), err)
	}
	key, err := c.Keys.Open(ctx, o.SignerURI)
	if err != nil {
		return nil, signer.Description{}, err
	}
	defer key.Close()
	if !pki.KeyMatchesCert(key.Public(), certs[0]) {
		return nil, signer.Description{}, &attestation.CheckError{Check: attestation.CheckKeyMatch, Err: errors.New("the certificate is not for the key at --signer")}
	}
	if err := checkInstalledIssuer(o.Out.Dir, certs, key, c); err != nil {
		return nil, signer.Description{}, err
	}
	return certs[0], key.Describe(), nil
}

// checkInstalledIssuer applies the daemon's issuer.crt checks before
// install writes it, as intermediate sign and rotate --intermediate
// --finish do: pki.CheckIssuerChain against os-ca.crt and
// accepted-cas.crt when the target directory holds them, else the
// profile of the certificate itself (a ServerAuth-only CA).
func checkInstalledIssuer(d Dir, certs []*x509.Certificate, key signer.Signer, c *Ceremony) error {
	caPEM, err := readOptional(d, certdir.FileCACert)
	if err != nil || caPEM == nil {
		return errors.Join(err, pki.CheckServerAuthCA(certs[0]))
	}
	acceptedPEM, err := readOptional(d, certdir.FileAcceptedCAs)
	if err != nil {
		return err
	}
	_, roots, err := certdir.ParseBundle(caPEM, acceptedPEM)
	if err != nil {
		return fmt.Errorf("%s: %w", d.Path(""), err)
	}
	if err := pki.CheckIssuerChain(certs, roots, key.Public(), c.now()); err != nil {
		return fmt.Errorf("%s would be refused by the daemon: %w", d.Path(certdir.FileIssuerChain), err)
	}
	return nil
}
