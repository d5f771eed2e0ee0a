// Package fence is the policy of the HTTP calls the manager makes to URLs its users
// supply: a Prometheus gate's address and a notification's url, both read from Secrets
// in a task's namespace. Whoever can write those Secrets chooses where the manager
// connects from its own network, with the credentials the Secrets carry, and what the
// manager then writes into statuses, events and logs. The fence holds those calls to:
//   - https, unless the operator allows http (--allow-http-fetch);
//   - no link-local or cloud metadata address, checked on the address actually dialed,
//     so a DNS name, a redirect or a rebinding cannot reach one either, unless the
//     operator allows it (--allow-link-local-fetch);
//   - no loopback or unspecified address (127.0.0.0/8, ::1, 0.0.0.0, ::), checked the
//     same way, unless the operator allows it (--allow-loopback-fetch): the manager's
//     loopback is its own pod's (its metrics, probes and hook servers, a sidecar's
//     ports), or the host's on a host-network pod (RKE2's supervisor, etcd, the
//     kubelet), none of which a user's URL has any business reaching;
//   - redirects only within the same origin (scheme, host and port), at most
//     MaxRedirects: the Secret's token and headers never reach another host;
//   - a bounded time for the whole call and a bounded body;
//   - messages that carry no userinfo, no query and at most a short, sanitized excerpt
//     of what the server answered.
//
// Private addresses stay allowed: an in-cluster Prometheus or webhook lives there, and
// the manager's own network is the operator's to restrict (NetworkPolicy).
package fence

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
	"time"
	"unicode"
	"unicode/utf8"
)

// The manager flags that lift the fence's rules; messages of a refusal name them.
const (
	AllowHTTPFlag      = "allow-http-fetch"
	AllowLinkLocalFlag = "allow-link-local-fetch"
	AllowLoopbackFlag  = "allow-loopback-fetch"
)

// Bounds of a fenced call.
const (
	// DefaultTimeout bounds one call, from dialing to the end of the body, when the
	// Policy sets none.
	DefaultTimeout = 10 * time.Second
	// MaxRedirects is how many same-origin redirects a call follows.
	MaxRedirects = 3
	// ExcerptLength is how many characters of an answer a message may carry.
	ExcerptLength = 200
)

// Policy is what the manager's fenced calls may do. Its zero value is the strict one:
// https only, no link-local, metadata, loopback or unspecified address, DefaultTimeout.
type Policy struct {
	// AllowHTTP lets http URLs be fetched; false means https only.
	AllowHTTP bool
	// AllowLinkLocal lets link-local and cloud metadata addresses be dialed.
	AllowLinkLocal bool
	// AllowLoopback lets loopback and unspecified addresses be dialed.
	AllowLoopback bool
	// Timeout bounds one call; zero means DefaultTimeout.
	Timeout time.Duration

	// resolver, when set, looks names up instead of the system's (tests).
	resolver *net.Resolver
}

// RefusedError says which rule of the fence refused a call, and which flag lifts it.
// Trying again cannot help.
type RefusedError struct {
	msg string
}

func (e *RefusedError) Error() string { return e.msg }

// IsRefused reports whether err is, or wraps, a refusal of the fence.
func IsRefused(err error) bool {
	var r *RefusedError
	return errors.As(err, &r)
}

// CheckURL checks a URL's form and scheme against the policy. what names the URL in
// the message ("the address of Secret ns/name"); the message repeats only the URL's
// scheme and host, never its userinfo, path (a Slack webhook's secret) or query.
func (p Policy) CheckURL(what string, u *url.URL) error {
	if u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return fmt.Errorf("%s is not an http(s) URL with a host; set it to a URL such as https://host:port", what)
	}
	if u.Scheme == "http" && !p.AllowHTTP {
		return &RefusedError{fmt.Sprintf("%s (%s://%s) is plain http, and the manager fetches only https URLs; use https, or start the manager with --%s to allow http",
			what, u.Scheme, u.Host, AllowHTTPFlag)}
	}
	return nil
}

// Redact returns a URL for a message: scheme, host and path, without userinfo, query or
// fragment.
func Redact(u *url.URL) string {
	r := url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path, RawPath: u.RawPath}
	return r.String()
}

// Origin returns the scheme, host and port of a URL, the port made explicit.
func Origin(u *url.URL) string {
	port := u.Port()
	if port == "" {
		switch u.Scheme {
		case "https":
			port = "443"
		case "http":
			port = "80"
		}
	}
	return u.Scheme + "://" + net.JoinHostPort(u.Hostname(), port)
}

// Client makes fenced calls.
type Client struct {
	policy Policy
	http   *http.Client
}

// NewClient returns a Client that trusts roots (nil: the system's roots).
func (p Policy) NewClient(roots *x509.CertPool) *Client {
	dialer := &net.Dialer{Timeout: p.timeout(), KeepAlive: 30 * time.Second, Control: p.controlDial, Resolver: p.resolver}
	transport := &http.Transport{
		Proxy:                 p.proxy,
		DialContext:           dialer.DialContext,
		TLSClientConfig:       &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout:   p.timeout(),
		ResponseHeaderTimeout: p.timeout(),
		IdleConnTimeout:       90 * time.Second,
		MaxIdleConns:          10,
		ForceAttemptHTTP2:     true,
	}
	return &Client{policy: p, http: &http.Client{Transport: transport, CheckRedirect: p.checkRedirect}}
}

func (p Policy) timeout() time.Duration {
	if p.Timeout > 0 {
		return p.Timeout
	}
	return DefaultTimeout
}

// Response is what a fenced call got back.
type Response struct {
	// StatusCode and Status are the HTTP status.
	StatusCode int
	Status     string
	// Body is the answer, at most the limit Do was given.
	Body []byte
	// Truncated says the answer was longer than the limit.
	Truncated bool
}

// Do sends req, bounded by the policy's timeout, and reads at most limit bytes of the
// answer. Its errors carry no URL: a refusal is a *RefusedError naming the rule and
// flag, a slow server an error naming the time it was given.
func (c *Client) Do(req *http.Request, limit int64) (*Response, error) {
	ctx := req.Context()
	timeout := c.policy.timeout()
	if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < timeout {
		timeout = time.Until(deadline)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := c.http.Do(req.WithContext(ctx))
	if err != nil {
		return nil, c.describe(ctx, err, timeout)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err == nil && int64(len(body)) <= limit {
		// The transport may end a body cut by the deadline as if it were whole.
		err = context.Cause(ctx)
	}
	if err != nil {
		return nil, c.describe(ctx, fmt.Errorf("read the answer: %w", err), timeout)
	}
	out := &Response{StatusCode: resp.StatusCode, Status: resp.Status, Body: body}
	if int64(len(body)) > limit {
		out.Body, out.Truncated = body[:limit], true
	}
	return out, nil
}

// describe turns a call's error into one that names no URL (a *url.Error prints the
// whole URL, query and user name included) and says which timeout ran out.
func (c *Client) describe(ctx context.Context, err error, timeout time.Duration) error {
	var uerr *url.Error
	if errors.As(err, &uerr) {
		err = uerr.Err
	}
	if IsRefused(err) {
		return err
	}
	var nerr net.Error
	if ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &nerr) && nerr.Timeout()) {
		return fmt.Errorf("no complete answer within %s (the server is slow or unreachable): %w", roundTimeout(timeout), err)
	}
	return err
}

// roundTimeout rounds what was left of a caller's deadline (299.98ms) to what the caller
// gave (300ms).
func roundTimeout(d time.Duration) time.Duration {
	if d >= 100*time.Millisecond {
		return d.Round(100 * time.Millisecond)
	}
	return d.Round(time.Millisecond)
}

// checkRedirect follows a redirect only to the first request's origin, at most
// MaxRedirects times. A redirect to another origin is refused, not followed without the
// credentials: the operator then points the Secret at the right place, instead of a call
// that silently goes elsewhere (a POST's body with it) and fails there for lack of them.
func (p Policy) checkRedirect(req *http.Request, via []*http.Request) error {
	if len(via) > MaxRedirects {
		return &RefusedError{fmt.Sprintf("more than %d redirects; point the URL at where the server answers", MaxRedirects)}
	}
	from, to := Origin(via[0].URL), Origin(req.URL)
	if from != to {
		return &RefusedError{fmt.Sprintf("the server at %s redirected to another origin, %s, which the manager does not follow (it would carry the Secret's credentials there); set the URL to where the server answers", from, to)}
	}
	return nil
}

// proxy is the environment's proxy (HTTPS_PROXY, NO_PROXY). Through a proxy the
// manager dials only the proxy, so the host a request names is looked up and checked
// here; the proxy may resolve it differently, so the dial-time check remains the fence
// for direct calls.
func (p Policy) proxy(req *http.Request) (*url.URL, error) {
	proxy, err := http.ProxyFromEnvironment(req)
	if err != nil || proxy == nil || (p.AllowLinkLocal && p.AllowLoopback) {
		return proxy, err
	}
	resolver := p.resolver
	if resolver == nil {
		resolver = net.DefaultResolver
	}
	// A name the manager cannot resolve is the proxy's to resolve: nothing to check.
	addrs, _ := resolver.LookupNetIP(req.Context(), "ip", req.URL.Hostname())
	for _, a := range addrs {
		if err := p.checkAddr(a); err != nil {
			return nil, err
		}
	}
	return proxy, nil
}

// controlDial is the dialer's Control: it sees the address about to be connected,
// after DNS resolution, for every connection (redirects and retries included).
func (p Policy) controlDial(_, address string, _ syscall.RawConn) error {
	if p.AllowLinkLocal && p.AllowLoopback {
		return nil
	}
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return &RefusedError{fmt.Sprintf("cannot tell the address %q that is about to be dialed; refused", address)}
	}
	return p.checkAddr(ap.Addr())
}

func (p Policy) checkAddr(a netip.Addr) error {
	if why := Fenced(a); why != "" && !p.AllowLinkLocal {
		return &RefusedError{fmt.Sprintf("the URL leads to %s, %s, which the manager does not connect to; start the manager with --%s to allow it",
			a.WithZone(""), why, AllowLinkLocalFlag)}
	}
	if why := Local(a); why != "" && !p.AllowLoopback {
		return &RefusedError{fmt.Sprintf("the URL leads to %s, %s, which the manager does not connect to; start the manager with --%s to allow it",
			a.WithZone(""), why, AllowLoopbackFlag)}
	}
	return nil
}

// Local says why an address is the manager's own (a loopback or unspecified address),
// or "" when it is not. IPv4 addresses embedded in IPv6 (mapped, NAT64) are judged as
// IPv4.
func Local(a netip.Addr) string {
	a = embedded(a)
	switch {
	case a.IsLoopback():
		return "a loopback address (the manager's own pod, or its host on a host-network pod)"
	case a.IsUnspecified():
		// Dialing 0.0.0.0 or :: connects to the local host.
		return "an unspecified address (dialed, it reaches the manager's own host)"
	}
	return ""
}

// embedded is a without zone, and the IPv4 address it embeds when it is IPv4-mapped or
// NAT64 (RFC 6052).
func embedded(a netip.Addr) netip.Addr {
	a = a.Unmap().WithZone("")
	if nat64.Contains(a) {
		b := a.As16()
		a = netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]})
	}
	return a
}

// metadata are the cloud metadata and host addresses outside the link-local ranges.
var metadata = map[netip.Addr]string{
	// AWS's Instance Metadata Service over IPv6 on Nitro instances ("IPv6 on AWS",
	// Supporting Amazon VPC services); its IPv4 endpoint 169.254.169.254 is link-local.
	netip.MustParseAddr("fd00:ec2::254"): "the AWS instance metadata address",
	// Alibaba Cloud ECS's instance metadata (http://100.100.100.200/latest/meta-data).
	netip.MustParseAddr("100.100.100.200"): "the Alibaba Cloud instance metadata address",
	// Azure's WireServer, the host's own endpoint for VM agents and extensions
	// ("What is IP address 168.63.129.16?").
	netip.MustParseAddr("168.63.129.16"): "the Azure host (WireServer) address",
}

// nat64 is the well-known NAT64 prefix (RFC 6052): its addresses embed an IPv4 one.
var nat64 = netip.MustParsePrefix("64:ff9b::/96")

// Fenced says why an address is fenced (a link-local or metadata address), or "" when it
// is not. IPv4 addresses embedded in IPv6 (mapped, NAT64) are judged as IPv4.
func Fenced(a netip.Addr) string {
	a = embedded(a)
	if why, ok := metadata[a]; ok {
		return why
	}
	if a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() {
		// 169.254.0.0/16 (RFC 3927) and fe80::/10 (RFC 4291): where AWS, GCP, Azure,
		// OpenStack and others serve instance metadata (169.254.169.254) and AWS ECS its
		// task credentials (169.254.170.2).
		return "a link-local address (where clouds serve instance metadata and credentials)"
	}
	return ""
}

// Excerpt returns at most ExcerptLength characters of an answer for a message: each run
// of control, format (bidirectional overrides, zero-width) and space characters becomes
// one space, invalid UTF-8 is dropped, and each of secrets (the call's own credentials,
// which a server may echo) is replaced by "[redacted]".
func Excerpt(body []byte, secrets ...string) string {
	s := string(body)
	for _, secret := range secrets {
		if len(secret) >= 4 {
			s = strings.ReplaceAll(s, secret, "[redacted]")
		}
	}
	var b strings.Builder
	n := 0
	space := false
	for len(s) > 0 && n < ExcerptLength {
		r, size := utf8.DecodeRuneInString(s)
		s = s[size:]
		switch {
		case r == utf8.RuneError && size <= 1:
			continue
		case unicode.IsSpace(r) || unicode.IsControl(r) || unicode.Is(unicode.Cf, r):
			space = true
			continue
		}
		if space && n > 0 {
			b.WriteByte(' ')
			n++
			if n >= ExcerptLength {
				break
			}
		}
		space = false
		b.WriteRune(r)
		n++
	}
	out := b.String()
	if len(strings.TrimSpace(s)) > 0 {
		out += "…"
	}
	return out
}

// Secrets returns the values of a request's headers and of its URL's userinfo: what an
// Excerpt of its answer must not repeat.
func Secrets(req *http.Request) []string {
	var out []string
	for name, values := range req.Header {
		if name == "Content-Type" || name == "Accept" || name == "User-Agent" {
			continue
		}
		for _, v := range values {
			out = append(out, v)
			if _, rest, ok := strings.Cut(v, " "); ok {
				out = append(out, rest) // the token of "Bearer <token>" on its own
			}
		}
	}
	if u, p, ok := req.BasicAuth(); ok {
		out = append(out, u+":"+p, p)
	}
	if ui := req.URL.User; ui != nil {
		if p, ok := ui.Password(); ok {
			out = append(out, p)
		}
	}
	return out
}
