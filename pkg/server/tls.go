package server

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// TLS configures the gRPC port's transport security. With CertFile and
// KeyFile set the port speaks TLS only; with ClientCAFile too, every client
// (Envoy) must present a certificate signed by one of those CAs (mTLS).
type TLS struct {
	CertFile     string
	KeyFile      string
	ClientCAFile string
}

func (t TLS) enabled() bool { return t.CertFile != "" || t.KeyFile != "" || t.ClientCAFile != "" }

// config loads the files once to fail early, and returns a tls.Config that
// picks up a rotated certificate at the next handshake: Envoy keeps its
// connections for long, so a handshake is rare and a stat is cheap.
func (t TLS) config() (*tls.Config, error) {
	if t.CertFile == "" || t.KeyFile == "" {
		return nil, errors.New("server: TLS needs both a certificate and a key file")
	}
	kp := &keyPair{certFile: t.CertFile, keyFile: t.KeyFile}
	if _, err := kp.get(); err != nil {
		return nil, err
	}
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return kp.get()
		},
	}
	if t.ClientCAFile != "" {
		pem, err := os.ReadFile(t.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("server: read client CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("server: client CA %s holds no PEM certificate", t.ClientCAFile)
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// keyPair is a certificate and key reloaded when the certificate file
// changes (rotation by cert-manager and the like, without a restart).
type keyPair struct {
	certFile, keyFile string

	mu      sync.Mutex
	cert    *tls.Certificate
	modTime time.Time
}

func (k *keyPair) get() (*tls.Certificate, error) {
	st, err := os.Stat(k.certFile)
	if err != nil {
		return nil, fmt.Errorf("server: TLS certificate: %w", err)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.cert != nil && st.ModTime().Equal(k.modTime) {
		return k.cert, nil
	}
	c, err := tls.LoadX509KeyPair(k.certFile, k.keyFile)
	if err != nil {
		if k.cert != nil {
			return k.cert, nil // half-written rotation: keep serving the old one
		}
		return nil, fmt.Errorf("server: load TLS key pair: %w", err)
	}
	k.cert, k.modTime = &c, st.ModTime()
	return k.cert, nil
}
