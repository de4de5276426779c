package talos

import (
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/signer/pkcs11/softhsm"
	"github.com/steward-trustd/steward-trustd/tpmsim"
)

// BenchmarkIssuance measures full certificate issuance through the daemon
// (TLS, token, CSR checks, signing on the device, response), per backend,
// with 8 clients on kept-alive connections. Compare with the raw signature
// benchmarks in signer/tpm and signer/pkcs11.
//
//	cd test/talos && go test -run XXX -bench Issuance -benchtime 3s
func BenchmarkIssuance(b *testing.B) {
	b.Run("file", func(b *testing.B) {
		certs := gencreds(b)
		d := startDaemon(b, "TRUSTD_CERT_DIR="+certs, "TRUSTD_PEER_RATE=-1", "TRUSTD_SIGNER_QUEUE=1024")
		runIssuance(b, d, strings.TrimSpace(string(readFile(b, filepath.Join(certs, certdir.FileToken)))), readFile(b, filepath.Join(certs, certdir.FileCACert)))
	})
	b.Run("tpm-swtpm", func(b *testing.B) {
		sw := tpmsim.StartSwtpm(b, tpmsim.SwtpmOptions{})
		uri := "tpm:path=" + filepath.Join(b.TempDir(), "k.tpmkey") + ";" + sw.URIAttrs()
		dd := startOnDevice(b, uri)
		runIssuance(b, dd.daemon, dd.token, dd.caPEM)
	})
	b.Run("pkcs11-softhsm", func(b *testing.B) {
		tok, err := softhsm.New(b.TempDir(), "bench")
		if err != nil {
			b.Skip(err)
		}
		dd := startOnDevice(b, tok.URI("os-ca", []byte{1}), tok.Env())
		runIssuance(b, dd.daemon, dd.token, dd.caPEM)
	})
}

func runIssuance(b *testing.B, d *daemon, token string, caPEM []byte) {
	dd := &deviceDaemon{daemon: d, token: token, caPEM: caPEM}
	b.SetParallelism(4) // 4 x GOMAXPROCS(2) = 8 clients
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		c := dd.client(b)
		for pb.Next() {
			if code := dd.request(c); code != codes.OK {
				b.Errorf("request: %v", code)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "certs/s")
}
