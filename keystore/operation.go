package keystore

// Operation names a ceremony operation in its receipts (Receipt.Operation)
// and in a key's intent record. A re-run recognises its own earlier work
// by these names, so they are declared here once: a misspelt name would
// not match an earlier receipt and would silently disable resume.
type Operation string

// The operations, by stage. A key-creating step has its own operation
// (".key") so that the key is vouched for before the certificate exists.
const (
	opInit       Operation = "init"
	opInitKey    Operation = "init.key"
	opImport     Operation = "import"
	opRotate     Operation = "rotate"
	opRotateKey  Operation = "rotate.key"
	opRotateDone Operation = "rotate.finish"
	opTrustAdd   Operation = "trust.add"
	opTrustDrop  Operation = "trust.remove"

	opSignCSR     Operation = "sign-csr"
	opTalosconfig Operation = "talosconfig"
	opServerCert  Operation = "server-cert"

	opIntermediateKey          Operation = "intermediate.key"
	opIntermediateRequest      Operation = "intermediate.request"
	opIntermediateSign         Operation = "intermediate.sign"
	opIntermediateRotateFinish Operation = "intermediate.rotate.finish"
	opIntermediateAttest       Operation = "intermediate.attest"
	opIntermediateEnrol        Operation = "intermediate.enrol"
	opIntermediateInstall      Operation = "intermediate.install"
	opIntermediateConfirm      Operation = "intermediate.confirm"

	opAttest           Operation = "attest"
	opAttestRespond    Operation = "attest.respond"
	opVerifyAttest     Operation = "verify-attestation"
	opVerifyActivation Operation = "verify-attestation.activation"

	opPolicyApprove Operation = "policy.approve"
	opPolicyRevoke  Operation = "policy.revoke"
)

// Operations lists every operation a receipt may name.
func Operations() []Operation {
	return []Operation{
		opInit, opInitKey, opImport, opRotate, opRotateKey, opRotateDone, opTrustAdd, opTrustDrop,
		opSignCSR, opTalosconfig, opServerCert,
		opIntermediateKey, opIntermediateRequest, opIntermediateSign, opIntermediateRotateFinish,
		opIntermediateAttest, opIntermediateEnrol, opIntermediateInstall, opIntermediateConfirm,
		opAttest, opAttestRespond, opVerifyAttest, opVerifyActivation,
		opPolicyApprove, opPolicyRevoke,
	}
}
