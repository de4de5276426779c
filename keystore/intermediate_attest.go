package keystore

// Attested enrolment of a node's intermediate: the node's
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
	desc, err := c.describeKey(ctx, o.SignerURI)
	if err != nil {
		return nil, fmt.Errorf("intermediate request --attest: %w", err)
	}
	r := newReceipt(opIntermediateAttest, desc)
	r.Details = map[string]string{"name": csr.Subject.CommonName}
	out, err := c.record(d, &plan{receipt: r, outputs: []placement{{Dir: o.Out.Dir, File: File{Name: o.Out.Name, Data: data, Mode: 0o644}, Overwrite: true}}})
	if err != nil {
		return nil, err
	}
	path := o.Out.Dir.Path(o.Out.Name)
	out.Notes = []string{"take " + path + " (the attested request, not the PEM CSR) to the root's host and run `steward-trustd-ceremony intermediate sign --csr " + path + " --ek-roots EK-ROOTS.pem --ek-pin EK-FINGERPRINT ...`"}
	return out, nil
}

// describeKey opens the key at uri for its description.
func (c *Ceremony) describeKey(ctx context.Context, uri string) (_ signer.Description, err error) {
	key, err := c.Keys.Open(ctx, uri)
	if err != nil {
		return signer.Description{}, err
	}
	defer closeKey(key, &err)
	return key.Describe(), nil
}

// AttestedSign is what IntermediateSignAttested verifies.
type AttestedSign struct {
	// Request is the attested request file.
	Request []byte
	// Expect holds the EK roots and the expected policy; QualifyingData
	// and PublicKey are taken from the request's CSR.
	Expect attestation.Options
	// Pins, when set, name the only EK accepted for each node (by the
	// CSR's common name).
	Pins attestation.EKPins
}

// IntermediateSignAttested verifies an attested request (every check of
// attestation.Verify, and the node's EK pin) and only then signs the
// intermediate as IntermediateSign does; o.Out receives it sealed to
// the node's EK and AK with a fresh activation secret, so only that TPM
// can install it. The receipt says "pending activation", never
// "attested": evidence alone can be forged around a borrowed EK
// certificate; IntermediateConfirm records the node's proof that its
// TPM opened the file. A refusal writes nothing but its receipt.
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
	data, commitment, err := c.sealEnrolment(req.Evidence, cert)
	if err != nil {
		return nil, nil, fmt.Errorf("intermediate sign: %w", err)
	}
	is := planIntermediateSign(root, cert, o)
	is.op, is.outputs[0].File.Data = opIntermediateEnrol, data
	for k, v := range details {
		is.details[k] = v
	}
	is.details["outcome"], is.details["activationCommitment"] = "authorized", commitment
	is.details["attestation"] = "pending activation: evidence verified for EK " + res.EK.SHA256 + pinNote(a.Pins) +
		"; not attested until intermediate confirm checks the node's activation proof"
	out, err := c.record(receipts, is.plan())
	if err != nil {
		return nil, nil, fmt.Errorf("intermediate sign: %w", err)
	}
	out.Notes = []string{
		"give " + o.Out.Dir.Path(o.Out.Name) + " to the node: `steward-trustd-ceremony intermediate install --signer TPM_URI --in FILE --out issuer.crt` (only its TPM can open it; it writes issuer.activation.json)",
		"recorded as pending activation: bring the node's issuer.activation.json back and run `steward-trustd-ceremony intermediate confirm --proof issuer.activation.json --dir " + receipts.Path("") + "` to record it as attested",
	}
	return cert, out, nil
}

// pinNote says in the receipt whether the EK was pinned.
func pinNote(p attestation.EKPins) string {
	if p == nil {
		return " (no EK pin: any TPM under the EK roots)"
	}
	return " (the EK pinned for this node)"
}

// sealEnrolment seals cert with a fresh activation secret to the
// evidence's EK and AK; it returns the sealed file and the secret's
// commitment for the receipt.
func (c *Ceremony) sealEnrolment(ev *attestation.Evidence, cert *x509.Certificate) ([]byte, string, error) {
	enr, err := attestation.NewEnrolment(c.Rand, pki.EncodeCertificates(cert))
	if err != nil {
		return nil, "", err
	}
	payload, err := enr.Marshal()
	if err != nil {
		return nil, "", err
	}
	sealed, err := attestation.Seal(c.Rand, ev, payload)
	if err != nil {
		return nil, "", err
	}
	data, err := sealed.Marshal()
	return data, attestation.ActivationCommitment(enr.ActivationSecret), err
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
	if err == nil {
		err = a.Pins.Check(csr.Subject.CommonName, res.EK.SHA256)
	}
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
	// ProofOut receives the activation proof for the root (replaced
	// when it holds an older proof).
	ProofOut Target
}

// IntermediateInstall opens a sealed intermediate with
// TPM2_ActivateCredential, checks that it certifies the key at
// SignerURI and writes it, with the activation proof the root's
// IntermediateConfirm checks. A failure leaves a receipt.
func (c *Ceremony) IntermediateInstall(ctx context.Context, d Dir, o IntermediateInstallOptions) (*x509.Certificate, *Outcome, error) {
	err := replaceable(o.ProofOut, "an activation proof", func(b []byte) bool { _, err := attestation.ParseActivationProof(b); return err == nil })
	if err != nil {
		return nil, nil, fmt.Errorf("intermediate install: %w", err)
	}
	cert, proof, desc, err := c.openSealedIntermediate(ctx, o)
	if err != nil {
		return nil, nil, c.refusal(d, opIntermediateInstall, map[string]string{}, fmt.Errorf("intermediate install: %w", err))
	}
	r := newReceipt(opIntermediateInstall, desc)
	certReceipt(&r, cert)
	r.Details = map[string]string{"outcome": "installed; activation proof written for the root"}
	out, err := c.record(d, &plan{receipt: r, outputs: []placement{
		{Dir: o.Out.Dir, File: File{Name: o.Out.Name, Data: pki.EncodeCertificates(cert), Mode: 0o644}, Overwrite: o.Force},
		{Dir: o.ProofOut.Dir, File: File{Name: o.ProofOut.Name, Data: proof, Mode: 0o644}, Overwrite: true},
	}})
	if err != nil {
		return nil, nil, fmt.Errorf("intermediate install: %w", err)
	}
	out.Notes = []string{"take " + o.ProofOut.Dir.Path(o.ProofOut.Name) + " to the root's host: `steward-trustd-ceremony intermediate confirm --proof FILE --dir ROOT_DIR` records this enrolment as attested"}
	return cert, out, nil
}

func (c *Ceremony) openSealedIntermediate(ctx context.Context, o IntermediateInstallOptions) (_ *x509.Certificate, _ []byte, _ signer.Description, err error) {
	enr, err := openEnrolment(ctx, o)
	if err != nil {
		return nil, nil, signer.Description{}, err
	}
	certs, err := pki.ParseCertificates(enr.Chain)
	if err != nil || len(certs) == 0 {
		return nil, nil, signer.Description{}, errors.Join(errors.New("the sealed enrolment holds no certificate"), err)
	}
	key, err := c.Keys.Open(ctx, o.SignerURI)
	if err != nil {
		return nil, nil, signer.Description{}, err
	}
	defer closeKey(key, &err)
	if !pki.KeyMatchesCert(key.Public(), certs[0]) {
		return nil, nil, signer.Description{}, &attestation.CheckError{Check: attestation.CheckKeyMatch, Err: errors.New("the certificate is not for the key at --signer")}
	}
	if err := checkInstalledIssuer(o.Out.Dir, certs, key, c); err != nil {
		return nil, nil, signer.Description{}, err
	}
	proof, err := (&attestation.ActivationProof{Version: attestation.ActivationProofVersion, Certificate: pki.CertFingerprint(certs[0]), Secret: enr.ActivationSecret}).Marshal()
	return certs[0], proof, key.Describe(), err
}

// openEnrolment activates the sealed file on the TPM and decodes its
// payload.
func openEnrolment(ctx context.Context, o IntermediateInstallOptions) (*attestation.Enrolment, error) {
	sealed, err := attestation.ParseSealed(o.Sealed)
	if err != nil {
		return nil, err
	}
	payload, err := o.TPM.ActivateCredential(ctx, o.SignerURI, sealed)
	if err != nil {
		return nil, err
	}
	return attestation.ParseEnrolment(payload)
}

// IntermediateConfirm checks a node's activation proof against the
// commitment of the enrolment (in receipts) that sealed its certificate,
// and records the enrolment as attested: evidence verified at signing,
// and the TPM of that EK opened the sealed file. A refusal is recorded.
func (c *Ceremony) IntermediateConfirm(receipts Dir, proofFile []byte) (*Outcome, error) {
	details := map[string]string{}
	proof, err := attestation.ParseActivationProof(proofFile)
	if err != nil {
		return nil, fmt.Errorf("intermediate confirm: %w", err)
	}
	enrol, err := findEnrolment(receipts, proof.Certificate)
	if err != nil {
		return nil, fmt.Errorf("intermediate confirm: %w", err)
	}
	for _, k := range []string{"name", "ekCertificate", "ekRoot", "akName", "keyName"} {
		details[k] = enrol.Details[k]
	}
	r := Receipt{Operation: opIntermediateConfirm, Details: details}
	r.CertificateFingerprint, r.CertificateSubject, r.CertificateSerial, r.CertificateNotAfter = enrol.CertificateFingerprint, enrol.CertificateSubject, enrol.CertificateSerial, enrol.CertificateNotAfter
	if err := proof.Check(enrol.Details["activationCommitment"]); err != nil {
		return nil, c.refusal(receipts, opIntermediateConfirm, details, fmt.Errorf("intermediate confirm: %w", err))
	}
	details["outcome"] = "attested"
	details["attestation"] = "attested: key in the TPM of EK " + enrol.Details["ekCertificate"] + " (evidence verified at signing, activation proven)"
	out, err := c.record(receipts, &plan{receipt: r})
	if err != nil {
		return nil, fmt.Errorf("intermediate confirm: %w", err)
	}
	out.Notes = []string{"recorded the intermediate of " + details["name"] + " as " + details["attestation"]}
	return out, nil
}

// findEnrolment returns the authorized attested enrolment that issued
// the certificate with this fingerprint.
func findEnrolment(receipts Dir, certFingerprint string) (*Receipt, error) {
	rs, err := ReadReceipts(receipts)
	if err != nil {
		return nil, err
	}
	for i := range rs {
		r := &rs[i]
		if r.Operation == opIntermediateEnrol && r.Details["outcome"] == "authorized" && r.CertificateFingerprint == certFingerprint {
			if r.Details["activationCommitment"] == "" {
				return nil, fmt.Errorf("the enrolment of certificate %s predates activation proofs; sign the node's attested request again", certFingerprint)
			}
			return r, nil
		}
	}
	return nil, fmt.Errorf("no attested enrolment (intermediate sign --ek-roots) of certificate %s in %s; run confirm with --dir naming the root's ceremony directory that signed it", certFingerprint, receipts.Path(""))
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
