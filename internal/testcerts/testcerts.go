package testcerts

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Set is a CA and the certificates it signed, in memory and on disk.
type Set struct {
	Dir string // the directory holding the files below

	CAFile         string // PEM certificate of the CA
	ServerCertFile string // PEM server certificate (127.0.0.1, ::1, localhost)
	ServerKeyFile  string // PEM (PKCS #8) key of the server certificate
	ClientCertFile string // PEM client certificate (CN ClientName)
	ClientKeyFile  string // PEM (PKCS #8) key of the client certificate

	CAPool *x509.CertPool  // holds only the CA
	Server tls.Certificate // the server certificate and key
	Client tls.Certificate // the client certificate and key
}

// ClientName is the common name of every client certificate.
const ClientName = "tokensem-test-client"

// New makes a fresh CA with a server and a client certificate; its files
// live in a new t.TempDir(). Each call makes an unrelated CA, so a second
// Set is a CA the first one's peers do not trust.
func New(t testing.TB) *Set {
	t.Helper()
	s := &Set{Dir: t.TempDir()}
	s.CAFile = filepath.Join(s.Dir, "ca.pem")
	s.ServerCertFile = filepath.Join(s.Dir, "server.pem")
	s.ServerKeyFile = filepath.Join(s.Dir, "server-key.pem")
	s.ClientCertFile = filepath.Join(s.Dir, "client.pem")
	s.ClientKeyFile = filepath.Join(s.Dir, "client-key.pem")

	now := time.Now()
	caKey := newKey(t)
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: "tokensem test CA " + now.Format(time.RFC3339Nano)},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatalf("testcerts: CA: %v", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatalf("testcerts: CA: %v", err)
	}
	s.CAPool = x509.NewCertPool()
	s.CAPool.AddCert(ca)
	writePEM(t, s.CAFile, "CERTIFICATE", caDER)

	leaf := func(tmpl *x509.Certificate, certFile, keyFile string) tls.Certificate {
		t.Helper()
		key := newKey(t)
		tmpl.SerialNumber = serial(t)
		tmpl.NotBefore, tmpl.NotAfter = caTmpl.NotBefore, caTmpl.NotAfter
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatalf("testcerts: %s: %v", certFile, err)
		}
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			t.Fatalf("testcerts: %s: %v", keyFile, err)
		}
		writePEM(t, certFile, "CERTIFICATE", der)
		writePEM(t, keyFile, "PRIVATE KEY", keyDER)
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			t.Fatalf("testcerts: %v", err)
		}
		return pair
	}
	s.Server = leaf(&x509.Certificate{
		Subject:     pkix.Name{CommonName: "localhost"},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}, s.ServerCertFile, s.ServerKeyFile)
	s.Client = leaf(&x509.Certificate{
		Subject:     pkix.Name{CommonName: ClientName},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, s.ClientCertFile, s.ClientKeyFile)
	return s
}

// ServerConfig returns a server configuration presenting the server
// certificate. With requireClient, clients must present a certificate
// signed by the CA.
func (s *Set) ServerConfig(requireClient bool) *tls.Config {
	cfg := &tls.Config{Certificates: []tls.Certificate{s.Server}, MinVersion: tls.VersionTLS12}
	if requireClient {
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
		cfg.ClientCAs = s.CAPool
	}
	return cfg
}

// ClientConfig returns a client configuration that trusts only the CA. With
// withCert, it presents the client certificate.
func (s *Set) ClientConfig(withCert bool) *tls.Config {
	cfg := &tls.Config{RootCAs: s.CAPool, MinVersion: tls.VersionTLS12}
	if withCert {
		cfg.Certificates = []tls.Certificate{s.Client}
	}
	return cfg
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("testcerts: key: %v", err)
	}
	return k
}

func serial(t testing.TB) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		t.Fatalf("testcerts: serial: %v", err)
	}
	return n
}

func writePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatalf("testcerts: %v", err)
	}
}
