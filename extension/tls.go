package extension

import (
	"crypto/tls"
)

// modernCipherSuites are the TLS 1.2 suites the hook servers accept: forward-secret
// (ECDHE) and authenticated encryption (AES-GCM, ChaCha20-Poly1305) only. TLS 1.3 suites
// are not configurable and are all modern.
var modernCipherSuites = []uint16{
	tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
	tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
}

// ServingTLS is the TLS configuration every HTTPS server of the manager uses: TLS 1.2 or
// newer, modern cipher suites only.
func ServingTLS(c *tls.Config) {
	c.MinVersion = tls.VersionTLS12
	c.CipherSuites = modernCipherSuites
}
