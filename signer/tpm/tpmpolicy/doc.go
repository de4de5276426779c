// Package tpmpolicy is the part of the TPM backend that needs no TPM: the
// policy math, formats and checks that the daemon's signer, the ceremony
// (approvals, quotes, status) and the attestation verifier share.
//
//   - PCR selections: ParsePCRs, the one rule every selection goes
//     through (refusing software-resettable PCRs), and PolicyPCR digests.
//   - Policy authorities (Authority), the binding of a key's policyRef to
//     its PCR selection (Binding), and the authPolicy of a key under them
//     (AuthorizedPolicy, SignedPolicyDigestFor), computed as TPM 2.0 Part 3
//     §23 defines the policy commands.
//   - Approvals: their file format, signing (SignApproval) and the
//     software check (ParseApprovals), and the approvals directory the
//     signer watches (ApprovalDir).
//   - The key blob file ("TSS2 PRIVATE KEY", draft-bottomley-tpm2-keys):
//     KeyBlob, ParseKeyBlob, and the key's public template (KeyTemplate,
//     CheckKeyPublic).
//   - Quote verification against a pinned attestation key (VerifyQuote).
//
// It imports go-tpm's tpm2 package for its marshalling and policy
// calculator only; it never talks to a TPM (it does not import
// tpm2/transport, nor the backend in the parent package, nor tpmsim):
// TestNoDeviceAccess checks that.
package tpmpolicy
