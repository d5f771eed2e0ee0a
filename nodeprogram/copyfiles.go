package nodeprogram

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// runCopyFiles is `node copy-files --to=DIR --file=PATTERN...`: it copies the files of this
// container's own filesystem that each pattern (filepath.Glob) names into DIR, keeping
// their permission bits. It is how the cluster upgrade Job takes what it needs out of an
// image that has no shell: Rancher's system-agent-installer-rancher image is built FROM
// scratch with only /helm, the Rancher chart /rancher-<version>.tgz and /run.sh (rancher
// package/Dockerfile.installer), the files the release's upgrade_rancher extracts with
// wharfie (harvester-release-steps.md fact 16.1). The Job first copies this static binary
// into a shared emptyDir with the capi-inplace image, then runs that copy in the other
// image. A pattern that names no file fails: the image is not the one expected.
func runCopyFiles(_ context.Context, env *Env, args []string) error {
	var to string
	var patterns stringList
	fs := newFlagSet(env, "copy-files")
	fs.StringVar(&to, "to", "", "directory the files are copied into (it must exist)")
	fs.Var(&patterns, "file", "a file, or a filepath.Glob pattern, of this container's filesystem to copy; repeat for more")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if to == "" || len(patterns) == 0 {
		return usagef("copy-files needs --to and at least one --file")
	}
	for _, p := range patterns {
		matches, err := filepath.Glob(p)
		if err != nil {
			return usagef("--file=%s is not a valid pattern: %v", p, err)
		}
		if len(matches) == 0 {
			return fmt.Errorf("no file of this container matches %s: is the image the expected one?", p)
		}
		for _, m := range matches {
			if err := copyFile(m, filepath.Join(to, filepath.Base(m))); err != nil {
				return err
			}
			env.say("copied %s to %s\n", m, to)
		}
	}
	return nil
}

// copyFile copies the regular file from to dst with from's permission bits, through a
// temporary file renamed in place, so that a retried init container never leaves half a
// file.
func copyFile(from, dst string) error {
	src, err := os.Open(from)
	if err != nil {
		return fmt.Errorf("open %s: %w", from, err)
	}
	defer func() { _ = src.Close() }()
	info, err := src.Stat()
	if err != nil {
		return fmt.Errorf("stat %s: %w", from, err)
	}
	if !info.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", from)
	}
	tmp := dst + ".tmp"
	out, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, info.Mode().Perm())
	if err != nil {
		return fmt.Errorf("create %s: %w", tmp, err)
	}
	if _, err := io.Copy(out, src); err != nil {
		_ = out.Close()
		return fmt.Errorf("copy %s to %s: %w", from, tmp, err)
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := os.Chmod(tmp, info.Mode().Perm()); err != nil {
		return fmt.Errorf("chmod %s: %w", tmp, err)
	}
	return os.Rename(tmp, dst)
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }
