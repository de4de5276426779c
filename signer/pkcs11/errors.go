//go:build cgo

package pkcs11

import (
	"errors"
	"fmt"

	p11 "github.com/miekg/pkcs11"

	"github.com/steward-trustd/steward-trustd/signer"
)

// deviceLost reports whether err means the session, the login, the token
// or the module is gone, so the session must not be reused and the signer
// has to re-open (PKCS#11 v2.40 §5.1 return values).
func deviceLost(err error) bool {
	var rv p11.Error
	if !errors.As(err, &rv) {
		return false
	}
	switch rv {
	case p11.CKR_SESSION_HANDLE_INVALID, p11.CKR_SESSION_CLOSED,
		p11.CKR_DEVICE_REMOVED, p11.CKR_DEVICE_ERROR,
		p11.CKR_TOKEN_NOT_PRESENT, p11.CKR_TOKEN_NOT_RECOGNIZED,
		p11.CKR_SLOT_ID_INVALID,
		p11.CKR_USER_NOT_LOGGED_IN,
		p11.CKR_CRYPTOKI_NOT_INITIALIZED,
		// The key object vanished: the token was removed or
		// re-initialised under us (SoftHSM reports this when its token
		// directory goes away).
		p11.CKR_OBJECT_HANDLE_INVALID, p11.CKR_KEY_HANDLE_INVALID,
		// "Some horrible, unrecoverable error has occurred ... the token
		// is in an inconsistent state" (v2.40 §5.1.1): only a new session,
		// login and, failing those, C_Finalize and C_Initialize can clear
		// it. tpm2-pkcs11 reports a lost TPM or resource manager this way
		// and stays broken until it is re-initialised.
		p11.CKR_GENERAL_ERROR:
		return true
	}
	return false
}

// authFailed reports whether err is the token refusing the PIN. Such an
// error is never retried: tokens lock after a few failed logins.
func authFailed(err error) bool {
	var rv p11.Error
	if !errors.As(err, &rv) {
		return false
	}
	switch rv {
	case p11.CKR_PIN_INCORRECT, p11.CKR_PIN_LOCKED, p11.CKR_PIN_INVALID,
		p11.CKR_PIN_LEN_RANGE, p11.CKR_PIN_EXPIRED:
		return true
	}
	return false
}

// wrap adds context and the signer sentinel that matches err, keeping the
// pkcs11.Error in the chain: errors.Is(err, p11.Error(p11.CKR_...)) works.
func wrap(op string, err error) error {
	switch {
	case err == nil:
		return nil
	case deviceLost(err):
		return fmt.Errorf("pkcs11 %s: %w: %w", op, signer.ErrDeviceUnavailable, err)
	case authFailed(err):
		return fmt.Errorf("pkcs11 %s: %w: %w", op, signer.ErrAuthentication, err)
	}
	return fmt.Errorf("pkcs11 %s: %w", op, err)
}

// generateError says what the module rejected in C_GenerateKeyPair (the
// CKR name stays in the chain and the text) and what to do about it.
func generateError(err error) error {
	var rv p11.Error
	hint := "the module refused to generate the key"
	if errors.As(err, &rv) {
		switch rv {
		case p11.CKR_TEMPLATE_INCONSISTENT, p11.CKR_TEMPLATE_INCOMPLETE, p11.CKR_ATTRIBUTE_VALUE_INVALID,
			p11.CKR_ATTRIBUTE_TYPE_INVALID, p11.CKR_ATTRIBUTE_READ_ONLY:
			hint = "the module refused the key template (on the token, private, sensitive, not extractable, sign only); check the token's key policy, " +
				"or create the key with the module's own tool with those attributes and give its URI"
		case p11.CKR_DEVICE_MEMORY, p11.CKR_HOST_MEMORY:
			hint = "the token is out of memory; delete unused objects, and for a TPM behind tpm2-pkcs11 put a resource manager " +
				"(/dev/tpmrm0 or tpm2-abrmd) between module and TPM"
		case p11.CKR_GENERAL_ERROR, p11.CKR_FUNCTION_FAILED:
			hint = "the module failed without saying why; re-run with its own log on (tpm2-pkcs11: TPM2_PKCS11_LOG_LEVEL=2, " +
				"opencryptoki: OPENCRYPTOKI_TRACE_LEVEL=4, SoftHSM: log.level = DEBUG) to see the cause " +
				"(tpm2-pkcs11 on a TPM without a resource manager runs out of object slots)"
		}
	}
	return fmt.Errorf("%w; %s", wrap("C_GenerateKeyPair", err), hint)
}
