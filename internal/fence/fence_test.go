package fence

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"
)

func TestFenced(t *testing.T) {
	for addr, fenced := range map[string]bool{
		"169.254.169.254":        true, // AWS, GCP, Azure, OpenStack instance metadata
		"169.254.170.2":          true, // AWS ECS task credentials
		"169.254.0.1":            true,
		"fe80::1":                true,
		"fe80::a9fe:a9fe%eth0":   true,
		"::ffff:169.254.169.254": true, // IPv4-mapped
		"64:ff9b::a9fe:a9fe":     true, // NAT64 of 169.254.169.254
		"fd00:ec2::254":          true,
		"100.100.100.200":        true,
		"168.63.129.16":          true,
		"127.0.0.1":              false, // an in-cluster Prometheus is reached on these
		"::1":                    false,
		"10.43.0.10":             false,
		"192.168.1.5":            false,
		"172.16.0.1":             false,
		"100.64.0.1":             false,
		"fd00:ec2::253":          false,
		"8.8.8.8":                false,
		"64:ff9b::808:808":       false,
	} {
		why := Fenced(netip.MustParseAddr(addr))
		if (why != "") != fenced {
			t.Errorf("Fenced(%s) = %q, want fenced=%v", addr, why, fenced)
		}
	}
}

func TestCheckURL(t *testing.T) {
	u, _ := url.Parse("http://alice:pa55word@prom.example:9090/slack/T000/B000/XXXX?token=q5ecret")
	err := Policy{}.CheckURL("the address of Secret ns/prom", u)
	if !IsRefused(err) {
		t.Fatalf("http under the strict policy: %v, want a refusal", err)
	}
	msg := err.Error()
	for _, want := range []string{"the address of Secret ns/prom (http://prom.example:9090) is plain http", "--" + AllowHTTPFlag} {
		if !strings.Contains(msg, want) {
			t.Errorf("refusal %q does not say %q", msg, want)
		}
	}
	for _, secret := range []string{"alice", "pa55word", "XXXX", "q5ecret"} {
		if strings.Contains(msg, secret) {
			t.Errorf("refusal %q repeats %q of the URL", msg, secret)
		}
	}
	if err := (Policy{AllowHTTP: true}).CheckURL("x", u); err != nil {
		t.Errorf("http allowed: %v", err)
	}
	https, _ := url.Parse("https://prom.example")
	if err := (Policy{}).CheckURL("x", https); err != nil {
		t.Errorf("https under the strict policy: %v", err)
	}
	for _, raw := range []string{"ftp://prom.example", "prom.example:9090", "https:///path"} {
		bad, _ := url.Parse(raw)
		if err := (Policy{AllowHTTP: true}).CheckURL("x", bad); err == nil || IsRefused(err) || !strings.Contains(err.Error(), "not an http(s) URL") {
			t.Errorf("CheckURL(%s) = %v, want not an http(s) URL", raw, err)
		}
	}
}

func TestRedact(t *testing.T) {
	u, _ := url.Parse("https://alice:pw@prom.example:9090/prometheus?x=1#f")
	if got := Redact(u); got != "https://prom.example:9090/prometheus" {
		t.Fatalf("Redact = %q", got)
	}
}

func TestExcerpt(t *testing.T) {
	body := "\x1b[31mUnauthorized\x1b[0m\r\n\x00token s3cret-t0ken\u202eevil\u200b\n" + strings.Repeat("A", 5000) + "\xff"
	got := Excerpt([]byte(body), "Bearer s3cret-t0ken", "s3cret-t0ken")
	if strings.Contains(got, "s3cret") {
		t.Errorf("excerpt %q repeats the secret", got)
	}
	if !strings.HasPrefix(got, "[31mUnauthorized [0m token [redacted] evil") {
		t.Errorf("excerpt %q does not start with the sanitized text", got)
	}
	if n := utf8.RuneCountInString(got); n > ExcerptLength+1 || !strings.HasSuffix(got, "…") {
		t.Errorf("excerpt of %d characters, ending %q; want at most %d and an ellipsis", n, got[len(got)-5:], ExcerptLength+1)
	}
	for _, r := range got {
		if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || r == utf8.RuneError {
			t.Fatalf("excerpt %q holds %U", got, r)
		}
	}
	if got := Excerpt([]byte("Unauthorized\n")); got != "Unauthorized" {
		t.Errorf("Excerpt of a short answer = %q, want it whole and trimmed", got)
	}
}

// tlsServer is an httptest TLS server and a Client of the policy that trusts it.
func tlsServer(t *testing.T, p Policy, h http.Handler) (*httptest.Server, *Client) {
	t.Helper()
	srv := httptest.NewTLSServer(h)
	t.Cleanup(srv.Close)
	return srv, p.NewClient(srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs)
}

func get(t *testing.T, c *Client, u string, header http.Header) (*Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	return c.Do(req, 1<<10)
}

func TestRedirects(t *testing.T) {
	var elsewhere atomic.Int32
	other, _ := tlsServer(t, Policy{AllowLoopback: true}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Add(1)
		_, _ = io.WriteString(w, "got "+r.Header.Get("Authorization")+r.Header.Get("X-Api-Key"))
	}))
	srv, c := tlsServer(t, Policy{AllowLoopback: true}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/away":
			http.Redirect(w, r, other.URL+"/steal", http.StatusTemporaryRedirect)
		case "/moved":
			http.Redirect(w, r, "/here", http.StatusFound)
		case "/loop":
			http.Redirect(w, r, "/loop", http.StatusFound)
		default:
			_, _ = io.WriteString(w, "here "+r.Header.Get("Authorization"))
		}
	}))
	secret := http.Header{"Authorization": {"Bearer s3cret"}, "X-Api-Key": {"k3y"}}

	_, err := get(t, c, srv.URL+"/away", secret)
	if !IsRefused(err) || !strings.Contains(err.Error(), "redirected to another origin, "+Origin(mustParse(t, other.URL))) {
		t.Fatalf("cross-origin redirect: %v, want a refusal naming the other origin", err)
	}
	if n := elsewhere.Load(); n != 0 {
		t.Fatalf("the other origin was called %d times", n)
	}

	resp, err := get(t, c, srv.URL+"/moved", secret)
	if err != nil || string(resp.Body) != "here Bearer s3cret" {
		t.Fatalf("same-origin redirect: %+v, %v; want it followed with the credentials", resp, err)
	}

	if _, err := get(t, c, srv.URL+"/loop", nil); !IsRefused(err) || !strings.Contains(err.Error(), "more than 3 redirects") {
		t.Fatalf("redirect loop: %v, want a refusal after %d", err, MaxRedirects)
	}
}

func mustParse(t *testing.T, raw string) *url.URL {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func TestRefusesLinkLocalAddresses(t *testing.T) {
	c := Policy{AllowHTTP: true, Timeout: 2 * time.Second}.NewClient(nil)
	for _, u := range []string{"http://169.254.169.254/latest/meta-data/", "https://[fd00:ec2::254]/", "http://[fe80::1%25lo]:80/"} {
		_, err := get(t, c, u, nil)
		if !IsRefused(err) || !strings.Contains(err.Error(), "--"+AllowLinkLocalFlag) {
			t.Errorf("GET %s: %v, want a refusal naming --%s", u, err, AllowLinkLocalFlag)
		}
	}
	if err := (Policy{AllowLinkLocal: true}).controlDial("tcp", "169.254.169.254:80", nil); err != nil {
		t.Errorf("with link-local allowed the dial is refused: %v", err)
	}
}

// TestRefusesLoopbackAddresses: the manager's own pod and host are out of a user's
// URL's reach by default, in every spelling (loopback, unspecified, IPv4-mapped, NAT64),
// and the refusal names the flag that lifts it; with the flag the call goes through.
func TestRefusesLoopbackAddresses(t *testing.T) {
	srv, _ := tlsServer(t, Policy{AllowLoopback: true}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	_, port, _ := net.SplitHostPort(mustParse(t, srv.URL).Host)
	c := Policy{AllowHTTP: true, Timeout: 2 * time.Second}.NewClient(nil)
	for _, u := range []string{srv.URL, "http://127.0.0.1:" + port + "/", "http://127.9.9.9:" + port + "/", "http://[::1]:" + port + "/",
		"http://0.0.0.0:" + port + "/", "http://[::]:" + port + "/", "http://[::ffff:127.0.0.1]:" + port + "/", "http://[64:ff9b::7f00:1]:" + port + "/"} {
		_, err := get(t, c, u, nil)
		if !IsRefused(err) || !strings.Contains(err.Error(), "--"+AllowLoopbackFlag) {
			t.Errorf("GET %s: %v, want a refusal naming --%s", u, err, AllowLoopbackFlag)
		}
	}
	for _, a := range []string{"127.0.0.1", "::1", "0.0.0.0", "::", "::ffff:127.0.0.1"} {
		if Local(netip.MustParseAddr(a)) == "" {
			t.Errorf("%s is not judged the manager's own", a)
		}
	}
	for _, a := range []string{"10.0.0.1", "192.168.1.10", "fd00::1", "8.8.8.8"} {
		if why := Local(netip.MustParseAddr(a)); why != "" {
			t.Errorf("%s judged the manager's own (%s): a private address is an in-cluster service's", a, why)
		}
	}
	roots := srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	if resp, err := get(t, (Policy{AllowLoopback: true}).NewClient(roots), srv.URL, nil); err != nil || string(resp.Body) != "ok" {
		t.Fatalf("with loopback allowed: %+v, %v; want the answer", resp, err)
	}
	if err := (Policy{AllowLoopback: true}).controlDial("tcp", "169.254.169.254:80", nil); err == nil {
		t.Error("allowing loopback let a link-local address through")
	}
	if err := (Policy{AllowLinkLocal: true}).controlDial("tcp", "127.0.0.1:80", nil); err == nil {
		t.Error("allowing link-local let a loopback address through")
	}
}

// TestChecksTheResolvedAddress: a name is judged by the address it resolves to, when it
// is dialed: a name of the metadata address is refused, and so is a name of loopback,
// unless loopback is allowed.
func TestChecksTheResolvedAddress(t *testing.T) {
	srv, _ := tlsServer(t, Policy{AllowLoopback: true}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	_, port, _ := net.SplitHostPort(mustParse(t, srv.URL).Host)
	roots := srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs

	metadata := Policy{AllowLoopback: true, resolver: fakeDNS(netip.MustParseAddr("169.254.169.254"))}.NewClient(roots)
	if _, err := get(t, metadata, "https://metadata.test:"+port+"/", nil); !IsRefused(err) || !strings.Contains(err.Error(), "169.254.169.254") {
		t.Fatalf("a name of 169.254.169.254: %v, want a refusal at dial time", err)
	}
	// The httptest certificate is for example.com, 127.0.0.1 and ::1.
	fenced := Policy{resolver: fakeDNS(netip.MustParseAddr("127.0.0.1"))}.NewClient(roots)
	if _, err := get(t, fenced, "https://example.com:"+port+"/", nil); !IsRefused(err) || !strings.Contains(err.Error(), "--"+AllowLoopbackFlag) {
		t.Fatalf("a name of 127.0.0.1: %v, want a refusal at dial time naming --%s", err, AllowLoopbackFlag)
	}
	loopback := Policy{AllowLoopback: true, resolver: fakeDNS(netip.MustParseAddr("127.0.0.1"))}.NewClient(roots)
	if resp, err := get(t, loopback, "https://example.com:"+port+"/", nil); err != nil || string(resp.Body) != "ok" {
		t.Fatalf("a name of 127.0.0.1 with loopback allowed: %+v, %v; want the answer", resp, err)
	}
}

func TestSlowServers(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	srv, c := tlsServer(t, Policy{AllowLoopback: true, Timeout: 300 * time.Millisecond}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/body" {
			w.WriteHeader(http.StatusOK)
			_, _ = io.WriteString(w, "start")
			w.(http.Flusher).Flush()
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	for _, path := range []string{"/headers", "/body"} {
		start := time.Now()
		_, err := get(t, c, srv.URL+path, nil)
		if err == nil || !strings.Contains(err.Error(), "no complete answer within 300ms") {
			t.Errorf("GET %s of a server that never ends: %v, want no complete answer within 300ms", path, err)
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("GET %s took %s", path, took)
		}
	}
	// A shorter deadline of the caller is the one named.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/headers", nil)
	if _, err := c.Do(req, 10); err == nil || !strings.Contains(err.Error(), "no complete answer within") || strings.Contains(err.Error(), "within 300ms") {
		t.Errorf("with the caller's 100ms: %v", err)
	}
}

func TestBodyLimit(t *testing.T) {
	srv, c := tlsServer(t, Policy{AllowLoopback: true}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, strings.Repeat("x", 5000))
	}))
	resp, err := get(t, c, srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Body) != 1<<10 || !resp.Truncated {
		t.Fatalf("a 5000-byte answer read with a limit of 1024: %d bytes, truncated=%v", len(resp.Body), resp.Truncated)
	}
}

func TestSecrets(t *testing.T) {
	req, _ := http.NewRequest(http.MethodGet, "https://bob:hunter22@h/", nil)
	req.Header.Set("Authorization", "Bearer t0ken")
	req.Header.Set("X-Api-Key", "k3y")
	req.Header.Set("Content-Type", "application/json")
	got := strings.Join(Secrets(req), "|")
	for _, want := range []string{"Bearer t0ken", "t0ken", "k3y", "hunter22"} {
		if !strings.Contains(got, want) {
			t.Errorf("Secrets = %q, missing %q", got, want)
		}
	}
	if strings.Contains(got, "application/json") {
		t.Errorf("Secrets = %q holds the Content-Type", got)
	}
}

// fakeDNS is a resolver whose every A query is answered with addr (AAAA with nothing),
// spoken over a stream connection as DNS over TCP (RFC 1035 section 4.2.2).
func fakeDNS(addr netip.Addr) *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(context.Context, string, string) (net.Conn, error) {
		client, server := net.Pipe()
		go func() {
			defer func() { _ = server.Close() }()
			for {
				var n uint16
				if err := binary.Read(server, binary.BigEndian, &n); err != nil {
					return
				}
				q := make([]byte, n)
				if _, err := io.ReadFull(server, q); err != nil {
					return
				}
				answer, err := answerDNS(q, addr)
				if err != nil {
					return
				}
				_ = binary.Write(server, binary.BigEndian, uint16(len(answer)))
				_, _ = server.Write(answer)
			}
		}()
		return client, nil
	}}
}

// answerDNS answers the one question of query q: an A record of addr for type A, no
// record for any other type.
func answerDNS(q []byte, addr netip.Addr) ([]byte, error) {
	if len(q) < 12 {
		return nil, errors.New("short query")
	}
	end := 12
	for end < len(q) && q[end] != 0 {
		end += int(q[end]) + 1
	}
	end += 5 // the root label, type and class
	if end > len(q) {
		return nil, errors.New("short question")
	}
	qtype := binary.BigEndian.Uint16(q[end-4:])
	out := append([]byte{}, q[0:2]...)                    // ID
	out = append(out, 0x81, 0x80, 0, 1, 0, 0, 0, 0, 0, 0) // response, recursion; one question
	out = append(out, q[12:end]...)
	if qtype == 1 && addr.Is4() {
		out[7] = 1 // one answer
		ip := addr.As4()
		out = append(out, 0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4)
		out = append(out, ip[:]...)
	}
	return out, nil
}
