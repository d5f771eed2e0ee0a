package nodeprogram

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

var fakeISO = []byte("not really an ISO, but 9660 bytes of it would be the same to a checksum")

func downloadArgs(dir, url string, extra ...string) []string {
	return append([]string{"repository", "download", "--dir=" + dir, "--iso-url=" + url, "--poll-interval=5s", "--wait-timeout=1m"}, extra...)
}

func TestDownloadLeaderChecksAndMarksReady(t *testing.T) {
	srv := newFileServer(t, map[string][]byte{"/harvester-v1.6.0-amd64.iso": fakeISO})
	dir := t.TempDir()
	r := runNode(t, newFakeHost(t), nil, downloadArgs(dir, srv.URL+"/harvester-v1.6.0-amd64.iso", "--sha512="+strings.ToUpper(sha512Of(fakeISO)))...)
	r.expect(t, ExitOK, "capi-inplace node repository download: done")

	got, err := os.ReadFile(filepath.Join(dir, "harvester.iso"))
	if err != nil || string(got) != string(fakeISO) {
		t.Fatalf("ISO on the volume: %q, %v", got, err)
	}
	flag, err := os.ReadFile(filepath.Join(dir, "harvester.iso.ready"))
	if err != nil || strings.TrimSpace(string(flag)) != sha512Of(fakeISO) {
		t.Errorf("ready flag %q, %v; want the lower-case SHA-512", flag, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "harvester.iso.part")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("partial file left behind: %v", err)
	}

	// Run again: the flag names the same checksum, so nothing is downloaded.
	runNode(t, newFakeHost(t), nil, downloadArgs(dir, srv.URL+"/harvester-v1.6.0-amd64.iso", "--sha512="+sha512Of(fakeISO))...).expect(t, ExitOK)
	if n := srv.count("/harvester-v1.6.0-amd64.iso"); n != 1 {
		t.Errorf("the ISO was downloaded %d times, want once", n)
	}
}

func TestDownloadChecksumFile(t *testing.T) {
	sums := sha512Of([]byte("other")) + "  harvester-v1.6.0-arm64.iso\n" + sha512Of(fakeISO) + " *harvester-v1.6.0-amd64.iso\n"
	srv := newFileServer(t, map[string][]byte{"/harvester-v1.6.0-amd64.iso": fakeISO, "/sha512sums.txt": []byte(sums)})
	dir := t.TempDir()
	runNode(t, newFakeHost(t), nil, downloadArgs(dir, srv.URL+"/harvester-v1.6.0-amd64.iso", "--sha512-url="+srv.URL+"/sha512sums.txt")...).expect(t, ExitOK)
	if _, err := os.Stat(filepath.Join(dir, "harvester.iso.ready")); err != nil {
		t.Errorf("no ready flag: %v", err)
	}

	// A checksum file without a line for this ISO, and with two checksums, says so.
	r := runNode(t, newFakeHost(t), nil, downloadArgs(t.TempDir(), srv.URL+"/harvester-v1.7.0-amd64.iso", "--sha512-url="+srv.URL+"/sha512sums.txt")...)
	r.expect(t, ExitFailed, "has 2 SHA-512 lines and none names harvester-v1.7.0-amd64.iso")
}

func TestDownloadChecksumMismatch(t *testing.T) {
	srv := newFileServer(t, map[string][]byte{"/h.iso": fakeISO})
	dir := t.TempDir()
	wrong := sha512Of([]byte("another release"))
	r := runNode(t, newFakeHost(t), nil, downloadArgs(dir, srv.URL+"/h.iso", "--sha512="+wrong)...)
	r.expect(t, ExitFailed, "has SHA-512 "+sha512Of(fakeISO), "not the expected "+wrong, "check that the URL and the checksum are of the same release")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() != lockFileName {
			t.Errorf("%s left on the volume after a checksum mismatch", e.Name())
		}
	}
}

func TestDownloadRedownloadsOverAnotherRelease(t *testing.T) {
	srv := newFileServer(t, map[string][]byte{"/h.iso": fakeISO})
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "harvester.iso"), []byte("old release"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "harvester.iso.ready"), []byte(sha512Of([]byte("old release"))+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	runNode(t, newFakeHost(t), nil, downloadArgs(dir, srv.URL+"/h.iso", "--sha512="+sha512Of(fakeISO))...).expect(t, ExitOK)
	if got, _ := os.ReadFile(filepath.Join(dir, "harvester.iso")); string(got) != string(fakeISO) {
		t.Errorf("the old release's ISO was kept: %q", got)
	}
}

func TestDownloadHTTPErrors(t *testing.T) {
	srv := newFileServer(t, map[string][]byte{})
	srv.statuses["/busy.iso"] = 503
	sum := "--sha512=" + sha512Of(fakeISO)
	runNode(t, newFakeHost(t), nil, downloadArgs(t.TempDir(), srv.URL+"/missing.iso", sum)...).expect(t, ExitFailed, "404 Not Found: check the URL")
	runNode(t, newFakeHost(t), nil, downloadArgs(t.TempDir(), srv.URL+"/busy.iso", sum)...).expect(t, ExitRetry, "not done yet", "503")
}

func TestDownloadBadFlags(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--sha512=abc"}, "must be 128 hex digits"},
		{nil, "give the ISO's SHA-512 with --sha512"},
		{[]string{"--sha512=" + sha512Of(fakeISO), "--sha512-url=http://x/sums"}, "not both"},
		{[]string{"--sha512=" + sha512Of(fakeISO), "--file=a/b.iso"}, "must be a plain file name"},
	} {
		runNode(t, newFakeHost(t), nil, downloadArgs(t.TempDir(), "http://repo/h.iso", tt.args...)...).expect(t, ExitUsage, tt.want)
	}
}

func TestFollowerWaitsForTheLeader(t *testing.T) {
	srv := newFileServer(t, map[string][]byte{"/h.iso": fakeISO})
	dir := t.TempDir()
	lock, held, err := tryLock(filepath.Join(dir, lockFileName), "repo-pod-a")
	if err != nil || !held {
		t.Fatalf("the test could not take the lock: %v", err)
	}
	defer unlock(lock)
	sum := sha512Of(fakeISO)
	polls := 0
	// The leader finishes while the follower sleeps for the third time.
	finish := func(context.Context, time.Duration) error {
		polls++
		if polls == 3 {
			if err := os.WriteFile(filepath.Join(dir, "harvester.iso"), fakeISO, 0o644); err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(dir, "harvester.iso.ready"), []byte(sum+"\n"), 0o644)
		}
		return nil
	}
	r := runNode(t, newFakeHost(t), finish, downloadArgs(dir, srv.URL+"/h.iso", "--sha512="+sum)...)
	r.expect(t, ExitOK)
	if polls != 3 {
		t.Errorf("the follower slept %d times, want 3", polls)
	}
	if n := srv.count("/h.iso"); n != 0 {
		t.Errorf("the follower downloaded the ISO %d times", n)
	}
	if !strings.Contains(r.stdout, "waiting for the leader (repo-pod-a)") {
		t.Errorf("stdout %q does not name the leader", r.stdout)
	}
}

func TestFollowerTimesOut(t *testing.T) {
	srv := newFileServer(t, map[string][]byte{"/h.iso": fakeISO})
	dir := t.TempDir()
	lock, held, err := tryLock(filepath.Join(dir, lockFileName), "repo-pod-a")
	if err != nil || !held {
		t.Fatalf("the test could not take the lock: %v", err)
	}
	defer unlock(lock)
	polls := 0
	r := runNode(t, newFakeHost(t), func(context.Context, time.Duration) error { polls++; return nil },
		downloadArgs(dir, srv.URL+"/h.iso", "--sha512="+sha512Of(fakeISO))...)
	r.expect(t, ExitRetry, "the leader (repo-pod-a) has not written", "harvester.iso.ready after 1m0s", "delete "+filepath.Join(dir, lockFileName))
	// 1m of waiting, 5s apart.
	if polls != 12 {
		t.Errorf("the follower slept %d times before giving up, want 12", polls)
	}
	if n := srv.count("/h.iso"); n != 0 {
		t.Errorf("the follower downloaded the ISO %d times", n)
	}
}

func TestFollowerTakesOverFromADeadLeader(t *testing.T) {
	srv := newFileServer(t, map[string][]byte{"/h.iso": fakeISO})
	dir := t.TempDir()
	lock, held, err := tryLock(filepath.Join(dir, lockFileName), "repo-pod-a")
	if err != nil || !held {
		t.Fatalf("the test could not take the lock: %v", err)
	}
	// The leader dies (its lock goes) while the follower waits, leaving a partial file.
	if err := os.WriteFile(filepath.Join(dir, "harvester.iso.part"), []byte("half"), 0o644); err != nil {
		t.Fatal(err)
	}
	die := func(context.Context, time.Duration) error { unlock(lock); return nil }
	runNode(t, newFakeHost(t), die, downloadArgs(dir, srv.URL+"/h.iso", "--sha512="+sha512Of(fakeISO))...).expect(t, ExitOK)
	if n := srv.count("/h.iso"); n != 1 {
		t.Errorf("the ISO was downloaded %d times, want once by the new leader", n)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "harvester.iso")); string(got) != string(fakeISO) {
		t.Errorf("ISO %q", got)
	}
}

func TestConcurrentDownloadersDownloadOnce(t *testing.T) {
	srv := newFileServer(t, map[string][]byte{"/h.iso": fakeISO})
	// Hold each download open until every downloader has started (the followers have
	// slept once, the leader is downloading), so that they all contend while the leader
	// downloads. The wait is bounded: if the lock let several lead, the test fails instead
	// of hanging.
	const downloaders = 4
	var startedMu sync.Mutex
	started := 0
	start := func() { startedMu.Lock(); started++; startedMu.Unlock() }
	srv.before = func(string) {
		start()
		for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			startedMu.Lock()
			all := started >= downloaders
			startedMu.Unlock()
			if all {
				return
			}
		}
	}
	dir := t.TempDir()
	results := make([]result, downloaders)
	var done sync.WaitGroup
	for i := range downloaders {
		done.Go(func() {
			first := true
			results[i] = runNode(t, newFakeHost(t), func(ctx context.Context, _ time.Duration) error {
				if first {
					start()
					first = false
				}
				return sleep(ctx, 5*time.Millisecond)
			}, downloadArgs(dir, srv.URL+"/h.iso", "--sha512="+sha512Of(fakeISO), "--wait-timeout=1h")...)
		})
	}
	done.Wait()
	leaders := 0
	for i, r := range results {
		r.expect(t, ExitOK)
		if strings.Contains(r.stdout, "downloaded (") {
			leaders++
		} else if !strings.Contains(r.stdout, "waiting for the leader") {
			t.Errorf("downloader %d neither led nor waited: %s", i, r.stdout)
		}
	}
	if n := srv.count("/h.iso"); n != 1 || leaders != 1 {
		t.Errorf("%d downloads by %d leaders, want exactly one", n, leaders)
	}
}

func TestMount(t *testing.T) {
	host := newFakeHost(t)
	dir := t.TempDir()
	iso := filepath.Join(dir, "harvester.iso")
	target := filepath.Join(t.TempDir(), "htdocs", "harvester-iso")
	args := []string{"repository", "mount", "--image=" + iso, "--target=" + target}

	runNode(t, host, nil, args...).expect(t, ExitRetry, "has no ready flag yet", "run `repository download` first")
	if len(host.mountHistory) != 0 {
		t.Fatalf("mounted without a ready flag: %v", host.mountHistory)
	}

	if err := os.WriteFile(iso, fakeISO, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(iso+".ready", []byte(sha512Of(fakeISO)), 0o644); err != nil {
		t.Fatal(err)
	}
	runNode(t, host, nil, args...).expect(t, ExitOK, "repository mount: done")
	want := mountRecord{image: iso, target: target, fstype: "iso9660"}
	if len(host.mountHistory) != 1 || host.mountHistory[0] != want {
		t.Fatalf("mounts %+v, want %+v", host.mountHistory, want)
	}
	if _, err := os.Stat(target); err != nil {
		t.Errorf("mount point not created: %v", err)
	}
	// Mounted already: not mounted twice.
	r := runNode(t, host, nil, args...)
	r.expect(t, ExitOK)
	if len(host.mountHistory) != 1 || !strings.Contains(r.stdout, "already mounted") {
		t.Errorf("mounted again: %+v, %q", host.mountHistory, r.stdout)
	}
}

// TestMountAVirtualMachineImage mounts the disk.img of a VirtualMachineImage's volume,
// which has no ready flag: it is complete when the volume is there (facts, fact 15).
func TestMountAVirtualMachineImage(t *testing.T) {
	host := newFakeHost(t)
	disk := filepath.Join(t.TempDir(), "disk.img")
	target := filepath.Join(t.TempDir(), "htdocs", "harvester-iso")
	args := []string{"repository", "mount", "--image=" + disk, "--ready-flag=false", "--target=" + target}

	runNode(t, host, nil, args...).expect(t, ExitFailed, "the ISO to mount is not there", "disk.img")
	if len(host.mountHistory) != 0 {
		t.Fatalf("mounted a missing image: %v", host.mountHistory)
	}

	if err := os.WriteFile(disk, fakeISO, 0o644); err != nil {
		t.Fatal(err)
	}
	runNode(t, host, nil, args...).expect(t, ExitOK, "repository mount: done")
	want := mountRecord{image: disk, target: target, fstype: "iso9660"}
	if len(host.mountHistory) != 1 || host.mountHistory[0] != want {
		t.Fatalf("mounts %+v, want %+v", host.mountHistory, want)
	}

	runNode(t, host, nil, "repository", "mount", "--image="+disk, "--ready-flag=maybe").expect(t, ExitUsage, "invalid boolean value")
}

// TestDownloadCopiesFromAPeer: a pod of the repository that has no copy (the first start
// of a replica, or one rescheduled after a drain) copies the ISO from a ready peer, checks
// it, and leaves the release's URL alone; with no peer, or a peer whose copy is not the
// release's, it downloads from the release's URL.
func TestDownloadCopiesFromAPeer(t *testing.T) {
	upstream := newFileServer(t, map[string][]byte{"/h.iso": fakeISO})
	peer := newFileServer(t, map[string][]byte{"/harvester.iso": fakeISO})
	sum := "--sha512=" + sha512Of(fakeISO)

	dir := t.TempDir()
	r := runNode(t, newFakeHost(t), nil, downloadArgs(dir, upstream.URL+"/h.iso", sum, "--peer-url="+peer.URL+"/harvester.iso")...)
	r.expect(t, ExitOK)
	if !strings.Contains(r.stdout, "copied from a peer") {
		t.Errorf("stdout %q does not say the ISO was copied from a peer", r.stdout)
	}
	if got, err := os.ReadFile(filepath.Join(dir, "harvester.iso")); err != nil || string(got) != string(fakeISO) {
		t.Fatalf("ISO in the pod's volume: %q, %v", got, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "harvester.iso.ready")); err != nil {
		t.Errorf("no ready flag after a peer copy: %v", err)
	}
	if n := upstream.count("/h.iso"); n != 0 {
		t.Errorf("the release's URL was read %d times although a peer served the ISO", n)
	}

	// No peer answers (the first pod, or every pod gone): the release's URL.
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	dir = t.TempDir()
	r = runNode(t, newFakeHost(t), nil, downloadArgs(dir, upstream.URL+"/h.iso", sum, "--peer-url="+gone.URL+"/harvester.iso")...)
	r.expect(t, ExitOK)
	if n := upstream.count("/h.iso"); n != 1 || !strings.Contains(r.stdout, "no peer copy") {
		t.Errorf("with no peer: %d downloads from the release's URL, stdout %q; want 1 and the reason", n, r.stdout)
	}

	// A peer whose copy fails the checksum is not trusted: the release's URL, and the
	// partial copy is gone.
	bad := newFileServer(t, map[string][]byte{"/harvester.iso": []byte("a copy of another release")})
	dir = t.TempDir()
	runNode(t, newFakeHost(t), nil, downloadArgs(dir, upstream.URL+"/h.iso", sum, "--peer-url="+bad.URL+"/harvester.iso")...).expect(t, ExitOK)
	if n := upstream.count("/h.iso"); n != 2 {
		t.Errorf("after a bad peer copy: %d downloads from the release's URL, want 2", n)
	}
	if got, err := os.ReadFile(filepath.Join(dir, "harvester.iso")); err != nil || string(got) != string(fakeISO) {
		t.Errorf("ISO after a bad peer copy: %q, %v", got, err)
	}

	runNode(t, newFakeHost(t), nil, downloadArgs(t.TempDir(), upstream.URL+"/h.iso", sum, "--peer-url=nfs://peer/harvester.iso")...).
		expect(t, ExitUsage, "--peer-url", "must be an http:// or https:// URL")
}

// TestMountServesTheImageForPeers: `mount --hold --serve` serves the checked image itself,
// with ranges, for the pods that copy it, and nothing else; it stops with the hold.
func TestMountServesTheImageForPeers(t *testing.T) {
	host := newFakeHost(t)
	dir := t.TempDir()
	iso := filepath.Join(dir, "harvester.iso")
	if err := os.WriteFile(iso, fakeISO, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(iso+".ready", []byte(sha512Of(fakeISO)), 0o644); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	env := &Env{Host: host, Stdout: io.Discard, Stderr: io.Discard, Identity: "repo-0"}
	go func() {
		done <- Main(ctx, []string{"--termination-log=" + filepath.Join(t.TempDir(), "t"), "repository", "mount", "--image=" + iso,
			"--target=" + filepath.Join(t.TempDir(), "htdocs"), "--hold", "--serve=" + addr}, env)
	}()
	get := func(path, rng string) (int, string) {
		req, _ := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
		if rng != "" {
			req.Header.Set("Range", rng)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close() //nolint:errcheck // test
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if code, _ := get("/harvester.iso", ""); code == http.StatusOK || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code, body := get("/harvester.iso", ""); code != http.StatusOK || body != string(fakeISO) {
		t.Errorf("GET /harvester.iso: %d %q, want 200 and the ISO", code, body)
	}
	if code, body := get("/harvester.iso", "bytes=4-9"); code != http.StatusPartialContent || body != string(fakeISO[4:10]) {
		t.Errorf("ranged GET: %d %q, want 206 %q", code, body, fakeISO[4:10])
	}
	if code, _ := get("/harvester.iso.ready", ""); code != http.StatusNotFound {
		t.Errorf("GET of another file: %d, want 404", code)
	}
	cancel()
	select {
	case code := <-done:
		if code != ExitOK {
			t.Errorf("mount --hold ended with %d, want 0", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("mount --hold did not end with its context")
	}
	if code, _ := get("/harvester.iso", ""); code != 0 {
		t.Errorf("still served after the hold ended: %d", code)
	}

	runNode(t, host, nil, "repository", "mount", "--image="+iso, "--serve=:8080").expect(t, ExitUsage, "--serve needs --hold")
}
