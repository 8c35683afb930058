package main

// The "use" mode: open and really use device nodes, one record per device
// (see the package comment for the records).

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"unsafe"
)

// ioctl request numbers (linux/kvm.h, linux/if_tun.h, linux/loop.h).
const (
	kvmGetAPIVersion = 0xAE00
	kvmCreateVM      = 0xAE01
	tunSetIff        = 0x400454ca
	iffTun           = 0x0001
	iffNoPI          = 0x1000
	loopSetFD        = 0x4C00
	loopClrFD        = 0x4C01
	ifNameSize       = 16
	loopPatternSize  = 64 * 1024
)

type target struct {
	kind string
	path string
}

func parseTargets(args []string) ([]target, error) {
	if len(args) == 0 {
		return nil, errors.New("use: name at least one KIND:PATH, e.g. kvm:/dev/kvm")
	}
	out := make([]target, 0, len(args))
	for _, arg := range args {
		kind, path, ok := strings.Cut(arg, ":")
		if !ok || kind == "" || path == "" {
			return nil, fmt.Errorf("use: %q is not KIND:PATH, e.g. kvm:/dev/kvm", arg)
		}
		out = append(out, target{kind, path})
	}
	return out, nil
}

// use prints a record per target and returns the files to keep open until
// exit (tun devices, whose interfaces live as long as their fd).
func use(out *lineWriter, targets []target) []*os.File {
	start(out)
	var keep []*os.File
	for i, t := range targets {
		fields := []string{"use", "kind=" + escape(t.kind), "path=" + escape(t.path)}
		var more []string
		switch t.kind {
		case "kvm":
			more = useKVM(t.path)
		case "fuse":
			more = useFuse(t.path)
		case "tun":
			var f *os.File
			more, f = useTun(t.path, "dratun"+strconv.Itoa(i))
			if f != nil {
				keep = append(keep, f)
			}
		case "loop":
			more = useLoop(t.path, i)
		default:
			more = []string{"error=" + escape("unknown kind")}
		}
		out.line(append(fields, more...)...)
	}
	out.line("probe", "ready", "uses="+strconv.Itoa(len(targets)))
	return keep
}

// errnoName is the errno's symbolic name (EPERM), or its number.
func errnoName(err error) string {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return escape(err.Error())
	}
	names := map[syscall.Errno]string{
		syscall.EPERM: "EPERM", syscall.ENOENT: "ENOENT", syscall.EIO: "EIO",
		syscall.ENXIO: "ENXIO", syscall.EBADF: "EBADF", syscall.ENOMEM: "ENOMEM",
		syscall.EACCES: "EACCES", syscall.EFAULT: "EFAULT", syscall.EBUSY: "EBUSY",
		syscall.EEXIST: "EEXIST", syscall.ENODEV: "ENODEV", syscall.ENOTDIR: "ENOTDIR",
		syscall.EINVAL: "EINVAL", syscall.ENOTTY: "ENOTTY", syscall.ENOSPC: "ENOSPC",
		syscall.EROFS: "EROFS", syscall.ENOSYS: "ENOSYS", syscall.EOPNOTSUPP: "EOPNOTSUPP",
		syscall.EAGAIN: "EAGAIN", syscall.EINTR: "EINTR", syscall.ENFILE: "ENFILE",
		syscall.EMFILE: "EMFILE",
	}
	if name, ok := names[errno]; ok {
		return name
	}
	return "errno" + strconv.Itoa(int(errno))
}

func ioctl(fd uintptr, request, arg uintptr) (uintptr, error) {
	r, _, errno := syscall.Syscall(syscall.SYS_IOCTL, fd, request, arg)
	if errno != 0 {
		return r, errno
	}
	return r, nil
}

func openDevice(path string, flags int) (*os.File, string) {
	fd, err := syscall.Open(path, flags|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, "open=" + errnoName(err)
	}
	return os.NewFile(uintptr(fd), path), "open=ok"
}

func useKVM(path string) []string {
	f, opened := openDevice(path, syscall.O_RDWR)
	if f == nil {
		return []string{opened}
	}
	defer f.Close()
	out := []string{opened}
	version, err := ioctl(f.Fd(), kvmGetAPIVersion, 0)
	if err != nil {
		return append(out, "api="+errnoName(err))
	}
	out = append(out, "api="+strconv.Itoa(int(version)))
	vm, err := ioctl(f.Fd(), kvmCreateVM, 0)
	if err != nil {
		return append(out, "vm="+errnoName(err))
	}
	_ = syscall.Close(int(vm))
	return append(out, "vm=created")
}

func useFuse(path string) []string {
	f, opened := openDevice(path, syscall.O_RDWR)
	if f != nil {
		_ = f.Close()
	}
	return []string{opened}
}

// ifreq is struct ifreq as TUNSETIFF reads it: a name and the flags (the rest
// of the union is unused).
type ifreq struct {
	name  [ifNameSize]byte
	flags uint16
	_     [22]byte
}

func useTun(path, name string) ([]string, *os.File) {
	f, opened := openDevice(path, syscall.O_RDWR)
	if f == nil {
		return []string{opened}, nil
	}
	out := []string{opened}
	var req ifreq
	copy(req.name[:ifNameSize-1], name)
	req.flags = iffTun | iffNoPI
	if _, err := ioctl(f.Fd(), tunSetIff, uintptr(unsafe.Pointer(&req))); err != nil {
		_ = f.Close()
		return append(out, "ifname="+errnoName(err)), nil
	}
	got := string(bytes.TrimRight(req.name[:], "\x00"))
	out = append(out, "ifname="+escape(got))
	if _, err := os.Stat("/sys/class/net/" + got); err == nil {
		out = append(out, "sysfs=present")
	} else {
		out = append(out, "sysfs=absent")
	}
	return out, f
}

// loopPattern is what the probe writes to its backing file: recognisably its
// own (pid and index), and different in every block.
func loopPattern(index int) []byte {
	var b bytes.Buffer
	for block := 0; b.Len() < loopPatternSize; block++ {
		fmt.Fprintf(&b, "dradriver probe pid %d use %d block %08d\n", os.Getpid(), index, block)
	}
	return b.Bytes()[:loopPatternSize]
}

func useLoop(path string, index int) []string {
	backing := fmt.Sprintf("/tmp/probe-loop-%d-%d", os.Getpid(), index)
	pattern := loopPattern(index)
	if err := os.WriteFile(backing, pattern, 0o600); err != nil {
		return []string{"error=" + escape("backing file: "+err.Error())}
	}
	defer os.Remove(backing)
	file, err := os.OpenFile(backing, os.O_RDWR, 0)
	if err != nil {
		return []string{"error=" + escape("backing file: "+err.Error())}
	}
	defer file.Close()

	dev, opened := openDevice(path, syscall.O_RDWR)
	if dev == nil {
		return []string{opened}
	}
	defer dev.Close()
	out := []string{opened}
	if _, err := ioctl(dev.Fd(), loopSetFD, file.Fd()); err != nil {
		return append(out, "attached="+errnoName(err))
	}
	out = append(out, "attached=ok", "readback="+readBack(path, pattern))
	if _, err := ioctl(dev.Fd(), loopClrFD, 0); err != nil {
		return append(out, "detached="+errnoName(err))
	}
	return append(out, "detached=ok")
}

// readBack reads the pattern through a second open of the attached device
// (closed again before the caller detaches it).
func readBack(path string, pattern []byte) string {
	f, opened := openDevice(path, syscall.O_RDONLY)
	if f == nil {
		return strings.TrimPrefix(opened, "open=")
	}
	defer f.Close()
	got := make([]byte, len(pattern))
	n, err := f.ReadAt(got, 0)
	if err != nil && n < len(pattern) {
		return errnoName(err)
	}
	if !bytes.Equal(got, pattern) {
		return "mismatch"
	}
	return "ok"
}
