package tpm_test

import (
	"errors"
	"fmt"

	"github.com/steward-trustd/steward-trustd/signer"
	"github.com/steward-trustd/steward-trustd/signer/tpm"
)

// A key blob bound to PCRs 7 and 11 of the TPM behind /dev/tpmrm0; the
// URI's canonical form leaves out what is the default.
func ExampleParseURI() {
	u, err := tpm.ParseURI("tpm:path=/var/lib/steward-trustd/os-ca.tpmkey;pcrs=11,7;device=/dev/tpmrm0;timeout=10s")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(u.Path, u.PCRs, u.Device, u.Timeout)
	fmt.Println(u)
	// Output:
	// /var/lib/steward-trustd/os-ca.tpmkey [7 11] device=/dev/tpmrm0 10s
	// tpm:path=/var/lib/steward-trustd/os-ca.tpmkey;device=/dev/tpmrm0;pcrs=7,11
}

// A URI the parser refuses wraps signer.ErrInvalidURI, whatever is wrong.
func ExampleParseURI_invalid() {
	for _, uri := range []string{
		"tpm:handle=0x01000000",
		"tpm:path=/k.tpmkey;handle=0x81000100",
		"tpm:path=/k.tpmkey;pcrs=24",
	} {
		_, err := tpm.ParseURI(uri)
		fmt.Println(errors.Is(err, signer.ErrInvalidURI))
	}
	// Output:
	// true
	// true
	// true
}

// The ceremony rewrites a URI's PCR selection without touching the rest.
func ExampleWithPCRs() {
	uri, err := tpm.WithPCRs("tpm:handle=0x81000100;swtpm=127.0.0.1:2321", []int{7, 14})
	fmt.Println(uri, err)
	// Output:
	// tpm:handle=0x81000100;swtpm=127.0.0.1:2321;pcrs=7,14 <nil>
}
