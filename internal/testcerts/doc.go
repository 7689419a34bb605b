// Package testcerts makes throwaway X.509 certificates for tests: a CA, a
// server certificate for 127.0.0.1, ::1 and localhost, and a client
// certificate, all signed by that CA and written as PEM files into a
// t.TempDir(). It also runs a TLS-terminating loopback proxy (see Proxy),
// so that a plaintext broker can be reached as a TLS one.
package testcerts
