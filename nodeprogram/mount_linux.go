package nodeprogram

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

func chrootAttr(root string) *syscall.SysProcAttr { return &syscall.SysProcAttr{Chroot: root} }

// loopMount does what `mount -o loop,ro` does, with system calls, so that the image needs
// no mount binary: take a free loop device, attach the image read-only with autoclear
// (the device is released when the file system is unmounted), mount it read-only.
func loopMount(image, target, fstype string) error {
	file, err := os.Open(image)
	if err != nil {
		return fmt.Errorf("open the image to mount: %w", err)
	}
	defer file.Close() //nolint:errcheck // read only; the loop device holds its own reference
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("open /dev/loop-control (the container must be privileged): %w", err)
	}
	defer ctl.Close() //nolint:errcheck // nothing written
	var lastErr error
	// Another process can take the free device between GET_FREE and CONFIGURE: try again.
	for range 10 {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return fmt.Errorf("find a free loop device: %w", err)
		}
		device := fmt.Sprintf("/dev/loop%d", n)
		loop, err := os.OpenFile(device, os.O_RDONLY, 0)
		if err != nil {
			return fmt.Errorf("open %s: %w", device, err)
		}
		config := unix.LoopConfig{Fd: uint32(file.Fd())}
		config.Info.Flags = unix.LO_FLAGS_READ_ONLY | unix.LO_FLAGS_AUTOCLEAR
		err = unix.IoctlLoopConfigure(int(loop.Fd()), &config)
		if errors.Is(err, unix.EBUSY) {
			_ = loop.Close()
			lastErr = err
			continue
		}
		if err != nil {
			_ = loop.Close()
			return fmt.Errorf("attach %s to %s: %w", image, device, err)
		}
		mountErr := unix.Mount(device, target, fstype, unix.MS_RDONLY, "")
		// With autoclear, closing our descriptor releases the device unless it is mounted.
		_ = loop.Close()
		if mountErr != nil {
			return fmt.Errorf("mount %s (%s, %s) on %s: %w", device, image, fstype, target, mountErr)
		}
		return nil
	}
	return fmt.Errorf("no loop device stayed free long enough: %w", lastErr)
}

// bindMount does what `mount -o bind source target` does, in this process's mount
// namespace (the container's: the host does not see it).
func bindMount(source, target string) error {
	if err := unix.Mount(source, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s over %s: %w", source, target, err)
	}
	return nil
}

func unmount(target string) error {
	if err := unix.Unmount(target, 0); err != nil {
		return fmt.Errorf("unmount %s: %w", target, err)
	}
	return nil
}
