package nodeprogram

import (
	"context"
	"crypto/sha512"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The files on the shared volume, as upgrade-toolkit's downloader names them (facts,
// fact 49: leader.lock, harvester.iso, harvester.iso.ready). The lock is a file locked
// with flock(2) rather than toolkit's `mkdir`: the kernel (or the NFS server, when the
// client's lease ends) releases it when its holder dies, so a follower takes over a dead
// leader's download instead of waiting for a flag that never comes.
const (
	lockFileName  = "leader.lock"
	readySuffix   = ".ready"
	partialSuffix = ".part"
)

var sha512Hex = regexp.MustCompile(`^[0-9a-fA-F]{128}$`)

type downloadOptions struct {
	dir          string
	isoURL       string
	sha512       string
	sha512URL    string
	file         string
	peerURL      string
	waitTimeout  time.Duration
	pollInterval time.Duration
}

func runDownload(ctx context.Context, env *Env, args []string) error {
	var o downloadOptions
	fs := newFlagSet(env, "repository download")
	fs.StringVar(&o.dir, "dir", "/iso", "the directory the ISO is kept in: the pod's own volume (an emptyDir), or a volume pods share (then one leader downloads, the others wait for its ready flag)")
	fs.StringVar(&o.isoURL, "iso-url", "", "URL of the release ISO (required)")
	fs.StringVar(&o.sha512, "sha512", "", "SHA-512 of the ISO, 128 hex digits (this or --sha512-url is required)")
	fs.StringVar(&o.sha512URL, "sha512-url", "", "URL of a checksum file (`sha512sum` output) holding the ISO's SHA-512")
	fs.StringVar(&o.file, "file", "harvester.iso", "name of the ISO in --dir; the ready flag is <file>.ready")
	fs.StringVar(&o.peerURL, "peer-url", "", "URL where a ready peer serves its checked copy of the ISO (`repository mount --serve`): tried before --iso-url, so that a pod that lost its copy (a drain, a reschedule) copies it inside the cluster; --iso-url is used when no peer answers or a peer's copy fails the checksum")
	fs.DurationVar(&o.waitTimeout, "wait-timeout", 30*time.Minute, "how long a follower waits for the leader's ready flag before exiting with code 3")
	fs.DurationVar(&o.pollInterval, "poll-interval", 5*time.Second, "how often a follower looks for the ready flag and tries to take over the lock")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := o.validate(); err != nil {
		return err
	}
	want, err := o.checksum(ctx, env)
	if err != nil {
		return err
	}
	return download(ctx, env, o, want)
}

func (o *downloadOptions) validate() error {
	if o.isoURL == "" {
		return usagef("--iso-url is required: the URL of the release ISO, e.g. https://releases.rancher.com/harvester/v1.6.0/harvester-v1.6.0-amd64.iso")
	}
	if err := checkHTTPURL("--iso-url", o.isoURL); err != nil {
		return err
	}
	switch {
	case o.sha512 == "" && o.sha512URL == "":
		return usagef("give the ISO's SHA-512 with --sha512 (128 hex digits) or --sha512-url (a sha512sum file); without it a corrupt download would be served")
	case o.sha512 != "" && o.sha512URL != "":
		return usagef("give --sha512 or --sha512-url, not both")
	case o.sha512 != "" && !sha512Hex.MatchString(o.sha512):
		return usagef("--sha512 %q is not a SHA-512: it must be 128 hex digits", o.sha512)
	case o.sha512URL != "":
		if err := checkHTTPURL("--sha512-url", o.sha512URL); err != nil {
			return err
		}
	}
	if o.peerURL != "" {
		if err := checkHTTPURL("--peer-url", o.peerURL); err != nil {
			return err
		}
	}
	if o.file == "" || strings.Contains(o.file, "/") {
		return usagef("--file %q must be a plain file name", o.file)
	}
	if o.pollInterval <= 0 || o.waitTimeout <= 0 {
		return usagef("--poll-interval and --wait-timeout must be positive")
	}
	return nil
}

func checkHTTPURL(flagName, u string) error {
	if !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
		return usagef("%s %q must be an http:// or https:// URL", flagName, u)
	}
	return nil
}

// checksum is the expected SHA-512, in lower case.
func (o *downloadOptions) checksum(ctx context.Context, env *Env) (string, error) {
	if o.sha512 != "" {
		return strings.ToLower(o.sha512), nil
	}
	body, err := fetch(ctx, env, o.sha512URL)
	if err != nil {
		return "", fmt.Errorf("read the checksum file: %w", err)
	}
	defer body.Close() //nolint:errcheck // read only
	data, err := io.ReadAll(io.LimitReader(body, 1<<20))
	if err != nil {
		return "", retryf("read the checksum file %s: %w", o.sha512URL, err)
	}
	// sha512sum output: "<hex>  <name>" per line. Take the line naming the ISO, or the
	// only checksum in the file.
	isoName := filepath.Base(o.isoURL)
	var found []string
	for line := range strings.SplitSeq(string(data), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 || !sha512Hex.MatchString(fields[0]) {
			continue
		}
		if len(fields) > 1 && strings.TrimPrefix(fields[1], "*") == isoName {
			return strings.ToLower(fields[0]), nil
		}
		found = append(found, fields[0])
	}
	if len(found) == 1 {
		return strings.ToLower(found[0]), nil
	}
	return "", fmt.Errorf("the checksum file %s has %d SHA-512 lines and none names %s: point --sha512-url at the ISO's own checksum file or pass --sha512", o.sha512URL, len(found), isoName)
}

// download runs the leader/follower scheme: whoever holds the lock downloads; the others
// wait for the ready flag, and take over when the lock is free and the flag is still not
// there (the leader died).
func download(ctx context.Context, env *Env, o downloadOptions, want string) error {
	if err := os.MkdirAll(o.dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", o.dir, err)
	}
	iso := filepath.Join(o.dir, o.file)
	deadline := env.Now().Add(o.waitTimeout)
	for {
		ready, err := readyFor(iso, want)
		if err != nil || ready {
			if ready {
				env.say("%s is ready (SHA-512 %s…)\n", iso, want[:16])
			}
			return err
		}
		lock, held, err := tryLock(filepath.Join(o.dir, lockFileName), env.Identity)
		if err != nil {
			return err
		}
		if held {
			err := lead(ctx, env, o, iso, want)
			unlock(lock)
			return err
		}
		holder := lockHolder(filepath.Join(o.dir, lockFileName))
		if !env.Now().Before(deadline) {
			return retryf("the leader (%s) has not written %s%s after %s; look at its logs, or delete %s from the shared volume if no download is running",
				holder, iso, readySuffix, o.waitTimeout, filepath.Join(o.dir, lockFileName))
		}
		env.say("waiting for the leader (%s) to download %s\n", holder, iso)
		if err := env.Sleep(ctx, o.pollInterval); err != nil {
			return retryf("stopped while waiting for the leader: %w", err)
		}
	}
}

// readyFor tells whether the ISO on the volume is complete and is the one wanted: its
// ready flag holds the wanted checksum. A flag for another checksum (an earlier release
// on a reused volume) is not ready: the leader downloads again.
func readyFor(iso, want string) (bool, error) {
	data, err := os.ReadFile(iso + readySuffix)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read the ready flag: %w", err)
	}
	if strings.TrimSpace(string(data)) != want {
		return false, nil
	}
	if _, err := os.Stat(iso); err != nil {
		return false, nil
	}
	return true, nil
}

// tryLock takes the exclusive lock on path without waiting and records who holds it.
func tryLock(path, identity string) (*os.File, bool, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, false, fmt.Errorf("open the leader lock %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("lock %s (the shared volume must support file locks): %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(identity+"\n"), 0)
	}
	return f, true, nil
}

func unlock(f *os.File) {
	_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
	_ = f.Close()
}

func lockHolder(path string) string {
	data, err := os.ReadFile(path)
	if err != nil || strings.TrimSpace(string(data)) == "" {
		return "unknown holder"
	}
	return strings.TrimSpace(string(data))
}

// lead provides the ISO: from a ready peer when --peer-url is given and a peer answers
// with a copy whose SHA-512 is the wanted one, else from --iso-url.
func lead(ctx context.Context, env *Env, o downloadOptions, iso, want string) error {
	// Another leader may have finished between our look at the flag and our lock.
	if ready, err := readyFor(iso, want); err != nil || ready {
		return err
	}
	_ = os.Remove(iso + readySuffix)
	if o.peerURL != "" {
		env.say("%s: copying the ISO from a ready peer at %s\n", env.Identity, o.peerURL)
		n, err := fetchChecked(ctx, env, o.peerURL, iso, want)
		if err == nil {
			env.say("%s: %s copied from a peer (%d bytes, SHA-512 checked)\n", env.Identity, iso, n)
			return markReady(iso, want)
		}
		// No peer serves it yet (the first pod of the repository, or every pod gone), or
		// its copy is not the one wanted: the release's own URL is the source of truth.
		env.say("%s: no peer copy (%v); downloading from %s\n", env.Identity, err, o.isoURL)
	}
	env.say("leader %s: downloading %s to %s\n", env.Identity, o.isoURL, iso)
	n, err := fetchChecked(ctx, env, o.isoURL, iso, want)
	if err != nil {
		return err
	}
	env.say("leader %s: %s downloaded (%d bytes, SHA-512 checked)\n", env.Identity, iso, n)
	return markReady(iso, want)
}

// fetchChecked downloads url to a partial file next to iso, checks its SHA-512 and moves
// it into place, so that iso is always a complete, checked file; it returns the size.
func fetchChecked(ctx context.Context, env *Env, url, iso, want string) (int64, error) {
	body, err := fetch(ctx, env, url)
	if err != nil {
		return 0, fmt.Errorf("download the ISO: %w", err)
	}
	defer body.Close() //nolint:errcheck // read only
	partial := iso + partialSuffix
	f, err := os.Create(partial)
	if err != nil {
		return 0, fmt.Errorf("create %s: %w", partial, err)
	}
	hash := sha512.New()
	n, copyErr := io.Copy(io.MultiWriter(f, hash), body)
	closeErr := f.Close()
	if copyErr != nil {
		_ = os.Remove(partial)
		return n, retryf("download %s: %w after %d bytes", url, copyErr, n)
	}
	if closeErr != nil {
		_ = os.Remove(partial)
		return n, fmt.Errorf("write %s: %w", partial, closeErr)
	}
	got := hex.EncodeToString(hash.Sum(nil))
	if got != want {
		_ = os.Remove(partial)
		return n, fmt.Errorf("the ISO downloaded from %s (%d bytes) has SHA-512 %s, not the expected %s: check that the URL and the checksum are of the same release (the partial file was removed)",
			url, n, got, want)
	}
	if err := os.Rename(partial, iso); err != nil {
		return n, fmt.Errorf("move the checked ISO into place: %w", err)
	}
	return n, nil
}

// markReady writes the ready flag of a checked ISO: the flag names its SHA-512.
func markReady(iso, want string) error {
	if err := os.WriteFile(iso+readySuffix, []byte(want+"\n"), 0o644); err != nil {
		return fmt.Errorf("write the ready flag: %w", err)
	}
	return nil
}

// fetch GETs url. A refused or failing server is worth retrying; a 4xx answer is not.
func fetch(ctx context.Context, env *Env, url string) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("bad URL %q: %w", url, err)
	}
	resp, err := env.HTTP.Do(req)
	if err != nil {
		return nil, retryf("GET %s: %w", url, err)
	}
	if resp.StatusCode == http.StatusOK {
		return resp.Body, nil
	}
	_ = resp.Body.Close()
	if resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests {
		return nil, retryf("GET %s: %s", url, resp.Status)
	}
	return nil, &statusError{url: url, status: resp.Status, code: resp.StatusCode}
}

// statusError is a 4xx answer other than 429: the URL is wrong, or names nothing.
type statusError struct {
	url, status string
	code        int
}

func (e *statusError) Error() string {
	return fmt.Sprintf("GET %s: %s: check the URL", e.url, e.status)
}

// isNotFound tells whether err is a 404 answer.
func isNotFound(err error) bool {
	var s *statusError
	return errors.As(err, &s) && s.code == http.StatusNotFound
}

type mountOptions struct {
	image     string
	readyFlag bool
	target    string
	fstype    string
	hold      bool
	serve     string
}

func runMount(ctx context.Context, env *Env, args []string) error {
	var o mountOptions
	fs := newFlagSet(env, "repository mount")
	fs.StringVar(&o.image, "image", "/iso/harvester.iso", "the ISO to mount: the downloaded one, or the disk.img of a VirtualMachineImage's volume")
	fs.BoolVar(&o.readyFlag, "ready-flag", true, "the ISO is one `repository download` writes: mount it only once its ready flag <image>.ready exists; false for an ISO complete as soon as its volume is there (a VirtualMachineImage's disk.img)")
	fs.StringVar(&o.target, "target", "/srv/www/htdocs/harvester-iso", "directory to mount the ISO on (the web server's document root, shared with mount propagation)")
	fs.StringVar(&o.fstype, "fstype", "iso9660", "file system type of the image")
	fs.BoolVar(&o.hold, "hold", false, "after mounting, keep running until SIGTERM, then unmount (for a long-running container, so that the pod's volumes can be torn down)")
	fs.StringVar(&o.serve, "serve", "", "with --hold, also serve the image file itself, read-only, at /<its name> on this address (such as :8080), for the pods of the repository that copy it from a peer (`repository download --peer-url`)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if o.serve != "" && !o.hold {
		return usagef("--serve needs --hold: the image is served while the mount is held")
	}
	if o.image == "" || o.target == "" || o.fstype == "" {
		return usagef("--image, --target and --fstype must not be empty")
	}
	if o.readyFlag {
		if _, err := os.Stat(o.image + readySuffix); err != nil {
			return retryf("%s has no ready flag yet (%s): the download has not finished; run `repository download` first", o.image, o.image+readySuffix)
		}
	} else if _, err := os.Stat(o.image); err != nil {
		return fmt.Errorf("the ISO to mount is not there: %w (a VirtualMachineImage's volume holds disk.img when the image is imported with the cdi backend)", err)
	}
	if err := os.MkdirAll(o.target, 0o755); err != nil {
		return fmt.Errorf("create the mount point %s: %w", o.target, err)
	}
	mounted, err := env.host().Mounted(o.target)
	if err != nil {
		return err
	}
	if mounted {
		env.say("%s is already mounted\n", o.target)
	} else {
		if err := env.host().LoopMount(o.image, o.target, o.fstype); err != nil {
			return err
		}
		env.say("mounted %s read-only on %s\n", o.image, o.target)
	}
	if !o.hold {
		return nil
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, os.Interrupt)
	defer stop()
	if o.serve != "" {
		stopServing, err := servePeers(ctx, env, o.serve, o.image)
		if err != nil {
			return err
		}
		defer stopServing()
	}
	<-ctx.Done()
	if err := env.host().Unmount(o.target); err != nil {
		return err
	}
	env.say("unmounted %s\n", o.target)
	return nil
}

// servePeers serves the file image, read-only, at /<its name> on addr until stop is
// called: the checked copy a repository pod holds, for the pods that copy it from a peer.
// Range requests are answered, so a copy can go on where it broke.
func servePeers(ctx context.Context, env *Env, addr, image string) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("serve the ISO for peers on %s: %w", addr, err)
	}
	name := "/" + filepath.Base(image)
	srv := &http.Server{
		ReadHeaderTimeout: 10 * time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if req.URL.Path != name || (req.Method != http.MethodGet && req.Method != http.MethodHead) {
				http.NotFound(w, req)
				return
			}
			f, err := os.Open(image)
			if err != nil {
				http.Error(w, "the ISO is not there", http.StatusServiceUnavailable)
				return
			}
			defer f.Close() //nolint:errcheck // read only
			st, err := f.Stat()
			if err != nil {
				http.Error(w, "the ISO is not readable", http.StatusServiceUnavailable)
				return
			}
			http.ServeContent(w, req, name, st.ModTime(), f)
		}),
	}
	go func() { _ = srv.Serve(ln) }()
	env.say("serving %s for peers on %s%s\n", image, ln.Addr(), name)
	return func() {
		shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}, nil
}
