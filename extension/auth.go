package extension

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
)

// The manager's flags that say who may call each hook server. They are named here
// because a refused caller is told which one the operator sets.
const (
	FlagHookClientCA                        = "hook-client-ca"
	FlagExternalHookClientCA                = "external-hook-client-ca"
	FlagExternalHookTokenFile               = "external-hook-token-file"
	FlagExternalHookAllowAnonymousLab       = "external-hook-insecure-allow-anonymous"
	hookServerCAPI                          = "the Cluster API hook server"
	hookServerExternalUpgradeRequest        = "the ExternalUpgradeRequest server"
	bearerPrefix                            = "Bearer "
	tokenFileLimit                    int64 = 64 << 10
)

// Callers say who may call a hook server. The zero value lets every caller in: that is
// the Cluster API hook server without --hook-client-ca. A caller is let in when it
// presents a TLS client certificate that a CA of ClientCAFile signed (for client
// authentication), or when it sends "Authorization: Bearer <token>" with the content of
// TokenFile. Both files are read again when they change, so a rotated CA or token takes
// effect without a restart.
type Callers struct {
	// ClientCAFile is a PEM bundle of the CAs whose client certificates are accepted.
	ClientCAFile string
	// TokenFile holds the bearer token that is accepted (surrounding white space ignored).
	TokenFile string
	// RefuseAnonymous refuses every call when neither ClientCAFile nor TokenFile is set,
	// instead of letting every caller in.
	RefuseAnonymous bool
}

func (c Callers) open() bool {
	return c.ClientCAFile == "" && c.TokenFile == "" && !c.RefuseAnonymous
}

// Check reads the configured files once, so that a wrong path or an empty bundle stops
// the manager at its start with an error that names the flag. A token file that does not
// exist yet is accepted (a Secret mounted as optional appears later); calls are refused
// until it does.
func (c Callers) Check(caFlag, tokenFlag string) error {
	if c.ClientCAFile != "" {
		if _, err := readClientCAs(c.ClientCAFile); err != nil {
			return fmt.Errorf("--%s: %w", caFlag, err)
		}
	}
	if c.TokenFile != "" {
		if _, err := readToken(c.TokenFile); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("--%s: %w", tokenFlag, err)
		}
	}
	return nil
}

// requestClientCertificates makes the TLS handshake ask for a client certificate without
// verifying it there: the HTTP layer verifies it against the current CA bundle, so a
// caller without one (or with a wrong one) gets an answer that says what to present
// rather than a bare handshake failure. Go's TLS server still checks that the client
// holds the certificate's private key.
func requestClientCertificates(c *tls.Config) {
	c.ClientAuth = tls.RequestClientCert
}

// callerGate lets in the callers Callers allow and answers the others 401 or 403 with
// what to present.
type callerGate struct {
	server  string
	callers Callers
	// caFlag and tokenFlag name the flags that configure this server, for the answers.
	caFlag, tokenFlag string
	cas               fileCache[*x509.CertPool]
	token             fileCache[[]byte]
}

func newCallerGate(server string, callers Callers, caFlag, tokenFlag string) *callerGate {
	return &callerGate{
		server: server, callers: callers, caFlag: caFlag, tokenFlag: tokenFlag,
		cas:   fileCache[*x509.CertPool]{path: callers.ClientCAFile, read: readClientCAs},
		token: fileCache[[]byte]{path: callers.TokenFile, read: readToken},
	}
}

func (g *callerGate) wrap(next http.Handler) http.Handler {
	if g.callers.open() {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		status, refusal := g.admit(r)
		if refusal == "" {
			next.ServeHTTP(w, r)
			return
		}
		ctrl.Log.WithName("hook-auth").Info("refused a hook call", "server", g.server, "path", r.URL.Path,
			"remote", r.RemoteAddr, "reason", refusal)
		if g.callers.TokenFile != "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="capi-inplace"`)
		}
		http.Error(w, fmt.Sprintf("capi-inplace: %s refused the call: %s", g.server, refusal), status)
	})
}

// admit returns "" for a caller it lets in, else the HTTP status and why, naming what to
// present.
func (g *callerGate) admit(r *http.Request) (int, string) {
	c := g.callers
	if c.ClientCAFile == "" && c.TokenFile == "" {
		return http.StatusForbidden, fmt.Sprintf("it accepts no caller, because the manager was started with neither --%s nor --%s; "+
			"the operator sets one of them (or --%s=true, for a lab only)", g.caFlag, g.tokenFlag, FlagExternalHookAllowAnonymousLab)
	}
	var problems []string
	if c.ClientCAFile != "" {
		ok, problem := g.verifyCertificate(r)
		if ok {
			return 0, ""
		}
		problems = append(problems, problem)
	}
	status := http.StatusUnauthorized
	if c.TokenFile != "" {
		ok, tokenStatus, problem := g.verifyToken(r)
		if ok {
			return 0, ""
		}
		if tokenStatus != 0 {
			status = tokenStatus
		}
		problems = append(problems, problem)
	}
	return status, strings.Join(problems, "; ")
}

func (g *callerGate) verifyCertificate(r *http.Request) (bool, string) {
	want := fmt.Sprintf("a TLS client certificate signed by a CA of --%s", g.caFlag)
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		return false, "no client certificate was presented; present " + want
	}
	pool, err := g.cas.get()
	if err != nil {
		ctrl.Log.WithName("hook-auth").Error(err, "cannot read the client CA bundle", "server", g.server)
		return false, fmt.Sprintf("the manager cannot read its --%s bundle (see its log), so no client certificate is accepted", g.caFlag)
	}
	intermediates := x509.NewCertPool()
	for _, c := range r.TLS.PeerCertificates[1:] {
		intermediates.AddCert(c)
	}
	leaf := r.TLS.PeerCertificates[0]
	if _, err := leaf.Verify(x509.VerifyOptions{
		Roots: pool, Intermediates: intermediates, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}); err != nil {
		return false, fmt.Sprintf("the client certificate %q is not accepted (%v); present %s", leaf.Subject.CommonName, err, want)
	}
	return true, ""
}

func (g *callerGate) verifyToken(r *http.Request) (bool, int, string) {
	want := fmt.Sprintf("an Authorization: Bearer header with the token of --%s", g.tokenFlag)
	header := r.Header.Get("Authorization")
	if header == "" {
		return false, 0, "no bearer token was sent; send " + want
	}
	if !strings.HasPrefix(header, bearerPrefix) {
		return false, 0, "the Authorization header is not a bearer token; send " + want
	}
	token, err := g.token.get()
	if err != nil {
		ctrl.Log.WithName("hook-auth").Error(err, "cannot read the bearer token", "server", g.server)
		return false, http.StatusForbidden, fmt.Sprintf("the manager has no usable --%s token yet (see its log), so no bearer token is accepted", g.tokenFlag)
	}
	sent := sha256.Sum256([]byte(strings.TrimSpace(strings.TrimPrefix(header, bearerPrefix))))
	expected := sha256.Sum256(token)
	if subtle.ConstantTimeCompare(sent[:], expected[:]) != 1 {
		return false, http.StatusForbidden, "the bearer token is wrong; send " + want
	}
	return true, 0, ""
}

func readClientCAs(path string) (*x509.CertPool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read the client CA bundle: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("the client CA bundle %s holds no PEM certificate", path)
	}
	return pool, nil
}

func readToken(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read the bearer token: %w", err)
	}
	defer func() { _ = f.Close() }()
	data, err := io.ReadAll(io.LimitReader(f, tokenFileLimit+1))
	if err != nil {
		return nil, fmt.Errorf("read the bearer token %s: %w", path, err)
	}
	if int64(len(data)) > tokenFileLimit {
		return nil, fmt.Errorf("the bearer token file %s is longer than %d bytes", path, tokenFileLimit)
	}
	token := bytes.TrimSpace(data)
	if len(token) == 0 {
		return nil, fmt.Errorf("the bearer token file %s is empty", path)
	}
	return token, nil
}

// fileCache keeps what read made of a file until the file's size or modification time
// changes (a Secret volume swaps a symlink, which changes both as os.Stat sees them).
type fileCache[T any] struct {
	path string
	read func(string) (T, error)

	mu    sync.Mutex
	size  int64
	mtime time.Time
	value T
	ok    bool
}

func (c *fileCache[T]) get() (T, error) {
	var zero T
	info, err := os.Stat(c.path)
	if err != nil {
		return zero, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ok && info.Size() == c.size && info.ModTime().Equal(c.mtime) {
		return c.value, nil
	}
	v, err := c.read(c.path)
	if err != nil {
		c.ok = false
		return zero, err
	}
	c.value, c.size, c.mtime, c.ok = v, info.Size(), info.ModTime(), true
	return v, nil
}

// gatedServer is a webhook server whose every handler first passes a callerGate.
type gatedServer struct {
	webhook.Server
	gate *callerGate
}

// Register wraps h in the gate. Cluster API's runtime server registers every hook and
// its discovery handler through this method when it starts.
func (s gatedServer) Register(path string, h http.Handler) {
	s.Server.Register(path, s.gate.wrap(h))
}
