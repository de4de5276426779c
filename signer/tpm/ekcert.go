package tpm

import (
	"crypto/x509"
	"errors"
	"fmt"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"
)

// NV indices of the TCG EK Credential Profile (v2.5 §2.2.1.5).
const (
	// ekCertIndexRSA holds the DER certificate of the RSA 2048 EK.
	ekCertIndexRSA tpm2.TPMHandle = 0x01c00002
	// ekChainFirst..ekChainLast hold the EK certificate's issuing chain,
	// when the manufacturer stores it (DER certificates, concatenated).
	ekChainFirst tpm2.TPMHandle = 0x01c00100
	ekChainLast  tpm2.TPMHandle = 0x01c001ff
	// nvChunk is what one TPM2_NV_Read asks for; every TPM's
	// TPM_PT_NV_BUFFER_MAX is at least this.
	nvChunk = 512
	// maxNVCert bounds one NV certificate index.
	maxNVCert = 16 << 10
)

// ErrNoEKCertificate reports a TPM that holds no RSA EK certificate.
var ErrNoEKCertificate = errors.New("the TPM holds no RSA EK certificate in NV index 0x01c00002")

// readEKCertificate reads the RSA EK certificate and any chain the TPM
// stores.
func readEKCertificate(t transport.TPM) ([]byte, [][]byte, error) {
	cert, err := readNV(t, ekCertIndexRSA)
	if err != nil {
		if errors.Is(err, tpm2.TPMRCHandle) {
			return nil, nil, fmt.Errorf("%w: %w", ErrNoEKCertificate, err)
		}
		return nil, nil, fmt.Errorf("read the EK certificate: %w", err)
	}
	// Some TPMs pad the index after the DER certificate.
	if c, err := x509.ParseCertificate(trimDER(cert)); err == nil {
		cert = c.Raw
	}
	chain, err := readEKChain(t)
	return cert, chain, err
}

// readEKChain reads the chain indices the TPM defines.
func readEKChain(t transport.TPM) ([][]byte, error) {
	rsp, err := tpm2.GetCapability{Capability: tpm2.TPMCapHandles, Property: uint32(ekChainFirst), PropertyCount: 256}.Execute(t)
	if err != nil {
		return nil, fmt.Errorf("list NV indices (TPM2_GetCapability): %w", err)
	}
	hs, err := rsp.CapabilityData.Data.Handles()
	if err != nil {
		return nil, err
	}
	var chain [][]byte
	for _, h := range hs.Handle {
		if h < ekChainFirst || h > ekChainLast {
			continue
		}
		data, err := readNV(t, h)
		if err != nil {
			return nil, fmt.Errorf("read EK chain index 0x%08x: %w", uint32(h), err)
		}
		certs, err := x509.ParseCertificates(trimDER(data))
		if err != nil {
			return nil, fmt.Errorf("EK chain index 0x%08x: %w", uint32(h), err)
		}
		for _, c := range certs {
			chain = append(chain, c.Raw)
		}
	}
	return chain, nil
}

// trimDER cuts data after its DER SEQUENCEs, dropping padding.
func trimDER(data []byte) []byte {
	n := 0
	for n+4 <= len(data) && data[n] == 0x30 && data[n+1] == 0x82 {
		l := int(data[n+2])<<8 | int(data[n+3])
		if n+4+l > len(data) {
			break
		}
		n += 4 + l
	}
	if n == 0 {
		return data
	}
	return data[:n]
}

// readNV reads a whole NV index with owner authorization (the EK
// certificate indices are TPMA_NV_OWNERREAD), in chunks.
func readNV(t transport.TPM, idx tpm2.TPMHandle) ([]byte, error) {
	pub, err := tpm2.NVReadPublic{NVIndex: idx}.Execute(t)
	if err != nil {
		return nil, fmt.Errorf("TPM2_NV_ReadPublic 0x%08x: %w", uint32(idx), err)
	}
	nv, err := pub.NVPublic.Contents()
	if err != nil {
		return nil, err
	}
	if nv.DataSize > maxNVCert {
		return nil, fmt.Errorf("NV index 0x%08x is %d bytes (max %d)", uint32(idx), nv.DataSize, maxNVCert)
	}
	out := make([]byte, 0, nv.DataSize)
	for off := uint16(0); off < nv.DataSize; {
		n := min(nvChunk, nv.DataSize-off)
		rsp, err := tpm2.NVRead{
			AuthHandle: tpm2.AuthHandle{Handle: tpm2.TPMRHOwner, Auth: tpm2.PasswordAuth(nil)},
			NVIndex:    tpm2.NamedHandle{Handle: idx, Name: pub.NVName},
			Size:       n, Offset: off,
		}.Execute(t)
		if err != nil {
			return nil, fmt.Errorf("TPM2_NV_Read 0x%08x (owner authorization, empty password): %w", uint32(idx), err)
		}
		out = append(out, rsp.Data.Buffer...)
		off += n
	}
	return out, nil
}
