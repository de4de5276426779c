package attestation

import (
	"errors"
	"fmt"
)

// Check names one verifier check; a refusal names the check that failed.
type Check string

// The checks, in the order Verify runs them: each relies on what the
// ones before it proved.
const (
	CheckEKCertificate  Check = "ek-certificate"     // chains to an EK root, has the EK EKU
	CheckEKPublic       Check = "ek-public"          // the EK area is the TCG RSA template with the certificate's key
	CheckAKPublic       Check = "ak-public"          // restricted fixedTPM/fixedParent signing key, no decrypt
	CheckAttestFormat   Check = "attestation-format" // TPM_GENERATED_VALUE, type creation
	CheckAttestSig      Check = "attestation-signature"
	CheckQualifyingData Check = "qualifying-data" // extraData == the expected hash
	CheckCertifiedName  Check = "certified-name"  // objectName == name of the key's public area
	CheckCreationHash   Check = "creation-hash"   // creationHash == H(creation data)
	CheckKeyAttributes  Check = "key-attributes"  // created in the TPM, non-duplicable, sign only, policy only
	CheckKeyPolicy      Check = "key-policy"      // authPolicy is the expected one
	CheckPCRDigest      Check = "pcr-digest"      // creation PCR digest is the expected one
	CheckKeyMatch       Check = "key-match"       // the key is the CSR's (certificate's) key
	CheckCredential     Check = "credential"      // the sealed credential opens
	CheckEKPin          Check = "ek-pin"          // the EK is the one pinned for the node
	CheckActivation     Check = "activation"      // the node returned the secret sealed to its TPM
)

// ErrRefused is wrapped by every CheckError so that callers can tell a
// refusal from an I/O error with errors.Is.
var ErrRefused = errors.New("attestation refused")

// CheckError is a failed check.
type CheckError struct {
	Check Check
	Err   error
}

// Error implements error.
func (e *CheckError) Error() string {
	return fmt.Sprintf("attestation refused by check %s: %v", e.Check, e.Err)
}

// Unwrap returns the cause and ErrRefused.
func (e *CheckError) Unwrap() []error { return []error{ErrRefused, e.Err} }

func refuse(c Check, format string, args ...any) error {
	return &CheckError{Check: c, Err: fmt.Errorf(format, args...)}
}

// FailedCheck returns the check err names, or "" when err is no refusal.
func FailedCheck(err error) Check {
	var ce *CheckError
	if errors.As(err, &ce) {
		return ce.Check
	}
	return ""
}
