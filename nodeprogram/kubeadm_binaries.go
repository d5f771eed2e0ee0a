package nodeprogram

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// stage makes sure the host holds a verified copy of each named binary of version v at
// stagedPath: downloaded (--source url) or copied from --dir (--source dir), written to
// a partial file and renamed into place only once its SHA-256 is the expected one. A
// staged file that already has that checksum is kept, so a phase run again downloads
// nothing.
func (s *binarySource) stage(ctx context.Context, env *Env, v kubeVersion, names []string) error {
	arch := s.arch
	for _, name := range names {
		staged := env.host().Path(stagedPath(v, name))
		switch s.kind {
		case sourceURL:
			want := s.sums[name]
			if sum, _ := fileSHA256(staged); sum == want {
				env.say("%s %s is already staged at %s (SHA-256 %s…)\n", name, v, stagedPath(v, name), want[:16])
				continue
			}
			if arch == "" {
				var err error
				if arch, err = hostArch(ctx, env); err != nil {
					return err
				}
			}
			u, err := s.url(urlFields{Version: v.String(), Arch: arch, Binary: name})
			if err != nil {
				return usagef("--url-template: %v", err)
			}
			env.say("downloading %s %s from %s\n", name, v, redactURL(u))
			if err := downloadVerified(ctx, env, u, staged, name, want); err != nil {
				return err
			}
			env.say("%s %s staged at %s (SHA-256 checked)\n", name, v, stagedPath(v, name))
		case sourceDir:
			from := filepath.Join(s.dir, name)
			got, err := fileSHA256(from)
			if err != nil {
				return fmt.Errorf("read %s %s from --dir: %w (the init container must copy kubeadm, kubelet and kubectl into %s)", name, v, err, s.dir)
			}
			if want := s.sums[name]; want != "" && got != want {
				return fmt.Errorf("%s in %s has SHA-256 %s, not the expected %s: the image does not hold the binaries of the --sha256 given; nothing was installed", name, s.dir, got, want)
			}
			if sum, _ := fileSHA256(staged); sum == got {
				env.say("%s %s is already staged at %s\n", name, v, stagedPath(v, name))
				continue
			}
			if err := copyVerified(from, staged, got); err != nil {
				return err
			}
			env.say("%s %s copied from %s and staged at %s\n", name, v, s.dir, stagedPath(v, name))
		}
	}
	return nil
}

// hostArch is the host's architecture as Kubernetes names it in its release paths.
func hostArch(ctx context.Context, env *Env) (string, error) {
	out, err := env.host().Run(ctx, Command{Name: "uname", Args: []string{"-m"}})
	if err != nil {
		return "", fmt.Errorf("read the host's architecture: %w; pass --arch", err)
	}
	switch m := strings.TrimSpace(string(out)); m {
	case "x86_64", "amd64":
		return "amd64", nil
	case "aarch64", "arm64":
		return "arm64", nil
	default:
		return "", fmt.Errorf("the host's architecture %q (uname -m) is neither x86_64 nor aarch64: pass --arch with the name the URL uses", m)
	}
}

// downloadVerified downloads rawURL to dst through dst.part and renames it into place
// once its SHA-256 is want. A failure of the network or of the server (5xx, 429) is
// worth retrying; any other answer is not. Messages show the URL without its userinfo
// and query, which may hold credentials.
func downloadVerified(ctx context.Context, env *Env, rawURL, dst, name, want string) error {
	shown := redactURL(rawURL)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rawURL, nil)
	if err != nil {
		return fmt.Errorf("download %s: bad URL %s", name, shown)
	}
	resp, err := env.HTTP.Do(req)
	if err != nil {
		// url.Error repeats the whole URL: keep only its cause.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return retryf("download %s from %s: %v", name, shown, err)
	}
	defer resp.Body.Close() //nolint:errcheck // read only
	switch {
	case resp.StatusCode == http.StatusOK:
	case resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests:
		return retryf("download %s from %s: %s", name, shown, resp.Status)
	default:
		return fmt.Errorf("download %s from %s: %s: check --url-template, --version and --arch", name, shown, resp.Status)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fmt.Errorf("create %s: %w", filepath.Dir(dst), err)
	}
	partial := dst + partialSuffix
	f, err := os.OpenFile(partial, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o755)
	if err != nil {
		return fmt.Errorf("create %s: %w", partial, err)
	}
	hash := sha256.New()
	n, copyErr := io.Copy(io.MultiWriter(f, hash), resp.Body)
	if copyErr == nil {
		copyErr = f.Sync()
	}
	closeErr := f.Close()
	if copyErr != nil || closeErr != nil {
		_ = os.Remove(partial)
		if copyErr != nil {
			return retryf("download %s from %s: %v after %d bytes", name, shown, copyErr, n)
		}
		return fmt.Errorf("write %s: %w", partial, closeErr)
	}
	if got := hex.EncodeToString(hash.Sum(nil)); got != want {
		_ = os.Remove(partial)
		return fmt.Errorf("%s downloaded from %s (%d bytes) has SHA-256 %s, not the expected %s: check that --sha256 %s= and the URL are of the same version and architecture (nothing was installed)",
			name, shown, n, got, want, name)
	}
	if err := os.Rename(partial, dst); err != nil {
		return fmt.Errorf("move the checked %s into place: %w", name, err)
	}
	return nil
}

// redactURL is u without its userinfo, query and fragment.
func redactURL(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "(an unparsable URL)"
	}
	p.User, p.RawQuery, p.ForceQuery, p.Fragment, p.RawFragment = nil, "", false, "", ""
	return p.String()
}

// copyVerified copies from to dst through dst.part, checking that what was written has
// the SHA-256 want, and renames it into place, executable.
func copyVerified(from, dst, want string) error {
	src, err := os.Open(from)
	if err != nil {
		return fmt.Errorf("open %s: %w", from, err)
	}
	defer src.Close() //nolint:errcheck // read only
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fmt.Errorf("create %s: %w", filepath.Dir(dst), err)
	}
	return writeVerified(src, dst, want)
}

// writeVerified writes r to dst.part with mode 0755, and renames it to dst only if what
// was written has the SHA-256 want: dst is always absent, the file it was, or a complete
// checked file.
func writeVerified(r io.Reader, dst, want string) error {
	partial := dst + partialSuffix
	f, err := os.OpenFile(partial, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o755)
	if err != nil {
		return fmt.Errorf("create %s: %w", partial, err)
	}
	hash := sha256.New()
	_, err = io.Copy(io.MultiWriter(f, hash), r)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && hex.EncodeToString(hash.Sum(nil)) != want {
		err = fmt.Errorf("the copy does not have the SHA-256 %s of its source", want)
	}
	if err == nil {
		// The mode of a file created over an existing one is not changed by the umask
		// any more than this.
		err = os.Chmod(partial, 0o755)
	}
	if err != nil {
		_ = os.Remove(partial)
		return fmt.Errorf("write %s: %w", dst, err)
	}
	if err := os.Rename(partial, dst); err != nil {
		_ = os.Remove(partial)
		return fmt.Errorf("move %s into place: %w", dst, err)
	}
	return nil
}

// installStaged installs the staged binary name of version v at binDir on the host,
// atomically (a file next to it, renamed over it), unless the one there already is it.
func installStaged(env *Env, v kubeVersion, name, binDir string) error {
	staged := env.host().Path(stagedPath(v, name))
	want, err := fileSHA256(staged)
	if err != nil {
		return fmt.Errorf("the staged %s is not there: %w", name, err)
	}
	target := path.Join(binDir, name)
	dst := env.host().Path(target)
	if sum, _ := fileSHA256(dst); sum == want {
		env.say("%s is already %s %s\n", target, name, v)
		return nil
	}
	src, err := os.Open(staged)
	if err != nil {
		return fmt.Errorf("open the staged %s: %w", name, err)
	}
	defer src.Close() //nolint:errcheck // read only
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fmt.Errorf("create %s: %w", path.Dir(target), err)
	}
	if err := writeVerified(src, dst, want); err != nil {
		return fmt.Errorf("install %s %s at %s: %w", name, v, target, err)
	}
	env.say("installed %s %s at %s\n", name, v, target)
	return nil
}

// fileSHA256 is the SHA-256 of the file p, in lower-case hex.
func fileSHA256(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close() //nolint:errcheck // read only
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
