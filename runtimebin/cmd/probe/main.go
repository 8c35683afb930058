// Command probe is a tiny static program for containers in the local test
// cluster. It has three modes:
//
//	probe [pause]            the pod sandbox's pause process: sleeps, reaps
//	                         children on SIGCHLD, exits 0 on SIGTERM/SIGINT.
//	probe report [PATH...]   prints what the container sees, then sleeps like
//	                         pause until SIGTERM/SIGINT.
//	probe use KIND:PATH...   really uses each device (see "Use records" below),
//	                         prints one record per device, then sleeps like
//	                         pause until SIGTERM/SIGINT.
//
// Report output is one record per line, fields separated by single spaces.
// Inside a field, a space, a backslash and every byte below 0x21 or at 0x7f
// is written as a backslash and three octal digits (\040 for a space), the
// escaping /proc/self/mountinfo uses, so splitting a line on spaces is always
// safe. The records, in this order:
//
//	probe start pid=1 ppid=0 uid=0 gid=0 hostname=NAME
//	env KEY=VALUE                         (sorted by KEY)
//	path type=char rdev=1:3 mode=0666 uid=0 gid=0 name=/dev/null
//	path type=symlink rdev=- mode=0777 uid=0 gid=0 name=/dev/fd target=/proc/self/fd
//	mount id=ID parent=ID dev=MAJ:MIN root=ROOT point=POINT options=OPTS fstype=TYPE source=SRC super=OPTS
//	probe ready paths=N mounts=M
//	probe exit signal=terminated          (on SIGTERM/SIGINT, then exit 0)
//
// type is one of char, block, file, dir, symlink, fifo, socket; rdev is
// MAJOR:MINOR for char and block devices and "-" otherwise; mode holds the
// permission bits plus setuid/setgid/sticky in octal. Paths default to /dev,
// walked recursively without following symlinks; a PATH given on the command
// line is reported the same way (recursively if it is a directory). A path
// that cannot be read yields "path type=error ... name=PATH error=MESSAGE".
//
// # Use records
//
// "probe use" prints, with the same escaping:
//
//	probe start pid=1 ppid=0 uid=0 gid=0 hostname=NAME
//	use kind=kvm path=/dev/kvm open=ok api=12 vm=created
//	use kind=fuse path=/dev/fuse open=ok
//	use kind=tun path=/dev/net/tun open=ok ifname=dratun0 sysfs=present
//	use kind=loop path=/dev/loop3 open=ok attached=ok readback=ok detached=ok
//	probe ready uses=N
//	probe exit signal=terminated
//
// one "use" record per KIND:PATH argument, in order. A step that fails gives
// the errno's name (open=EPERM, vm=EPERM, ifname=EPERM, attached=EBUSY, ...)
// and ends that device's record; a failed open is what a container without
// the device in its device cgroup sees. What each kind does:
//
//	kvm   open O_RDWR; KVM_GET_API_VERSION (api=the version); KVM_CREATE_VM
//	      with type 0 (vm=created), then closes the VM.
//	fuse  open O_RDWR.
//	tun   open O_RDWR; TUNSETIFF for IFF_TUN|IFF_NO_PI named dratun<i>, i the
//	      argument's index (ifname=the name the kernel gave); sysfs=present if
//	      /sys/class/net/<name> exists (the container's own network namespace),
//	      else absent. The fd stays open until exit, so the interface lives as
//	      long as the container (and only in its network namespace).
//	loop  writes a file of its own under /tmp (a known pattern), LOOP_SET_FD
//	      on the device (attached=ok; EBUSY means another user has it, and the
//	      probe never forces it), reads the pattern back through the device
//	      (readback=ok, or mismatch), then LOOP_CLR_FD (detached=ok) and
//	      removes the file.
//
// An unknown kind gives "use kind=KIND path=PATH error=unknown\040kind".
package main

import (
	"fmt"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

func main() {
	args := os.Args[1:]
	mode := "pause"
	if len(args) > 0 {
		mode, args = args[0], args[1:]
	}
	switch mode {
	case "pause":
		os.Exit(sleepUntilSignal(nil))
	case "report":
		out := &lineWriter{f: os.Stdout}
		// Install the handlers before printing "ready", so a SIGTERM sent as
		// soon as the reader sees it is never lost.
		signals := notify()
		report(out, args)
		os.Exit(sleepUntilSignal(signals, out))
	case "use":
		targets, err := parseTargets(args)
		if err != nil {
			fmt.Fprintf(os.Stderr, "probe: %v\n", err)
			os.Exit(2)
		}
		out := &lineWriter{f: os.Stdout}
		signals := notify()
		keep := use(out, targets)
		code := sleepUntilSignal(signals, out)
		for _, f := range keep {
			_ = f.Close()
		}
		os.Exit(code)
	case "-h", "--help", "help":
		fmt.Println("usage: probe [pause] | probe report [PATH...] | probe use KIND:PATH...")
	default:
		fmt.Fprintf(os.Stderr, "probe: unknown mode %q (want pause, report or use)\n", mode)
		os.Exit(2)
	}
}

func notify() chan os.Signal {
	signals := make(chan os.Signal, 16)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	return signals
}

// sleepUntilSignal reaps children until SIGTERM or SIGINT and returns the exit
// code (0). As PID 1 of a container it is every orphan's parent.
func sleepUntilSignal(signals chan os.Signal, out ...*lineWriter) int {
	if signals == nil {
		signals = notify()
	}
	for sig := range signals {
		if sig == syscall.SIGCHLD {
			reap()
			continue
		}
		for _, w := range out {
			w.line("probe", "exit", "signal="+escape(sig.String()))
		}
		return 0
	}
	return 0
}

func reap() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}

// lineWriter writes each record with a single write(2), so lines from this
// process never interleave and a reader sees each one as soon as it is made.
type lineWriter struct {
	f *os.File
}

func (w *lineWriter) line(fields ...string) {
	_, _ = w.f.WriteString(strings.Join(fields, " ") + "\n")
}

// escape writes space, backslash, control bytes and DEL as \ooo.
func escape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c == '\\' || c == 0x7f {
			fmt.Fprintf(&b, "\\%03o", c)
		} else {
			b.WriteByte(c)
		}
	}
	return b.String()
}

func start(out *lineWriter) {
	hostname, _ := os.Hostname()
	out.line("probe", "start",
		"pid="+strconv.Itoa(os.Getpid()), "ppid="+strconv.Itoa(os.Getppid()),
		"uid="+strconv.Itoa(os.Getuid()), "gid="+strconv.Itoa(os.Getgid()),
		"hostname="+escape(hostname))
}

func report(out *lineWriter, paths []string) {
	start(out)

	env := os.Environ()
	sort.Strings(env)
	for _, kv := range env {
		out.line("env", escape(kv))
	}

	if len(paths) == 0 {
		paths = []string{"/dev"}
	}
	count := 0
	for _, root := range paths {
		count += walk(out, root)
	}

	mounts := reportMounts(out)
	out.line("probe", "ready", "paths="+strconv.Itoa(count), "mounts="+strconv.Itoa(mounts))
}

// walk reports root and, if it is a directory (not a symlink), everything
// below it in lexical order. It returns the number of path records.
func walk(out *lineWriter, root string) int {
	count := 0
	err := filepath.WalkDir(root, func(name string, _ fs.DirEntry, err error) error {
		count++
		if err != nil {
			out.line("path", "type=error", "name="+escape(name), "error="+escape(err.Error()))
			return nil
		}
		reportPath(out, name)
		return nil
	})
	if err != nil {
		out.line("path", "type=error", "name="+escape(root), "error="+escape(err.Error()))
	}
	return count
}

func reportPath(out *lineWriter, name string) {
	var st syscall.Stat_t
	if err := syscall.Lstat(name, &st); err != nil {
		out.line("path", "type=error", "name="+escape(name), "error="+escape(err.Error()))
		return
	}
	kind := "other"
	switch st.Mode & syscall.S_IFMT {
	case syscall.S_IFCHR:
		kind = "char"
	case syscall.S_IFBLK:
		kind = "block"
	case syscall.S_IFREG:
		kind = "file"
	case syscall.S_IFDIR:
		kind = "dir"
	case syscall.S_IFLNK:
		kind = "symlink"
	case syscall.S_IFIFO:
		kind = "fifo"
	case syscall.S_IFSOCK:
		kind = "socket"
	}
	rdev := "-"
	if kind == "char" || kind == "block" {
		rdev = fmt.Sprintf("%d:%d", major(st.Rdev), minor(st.Rdev))
	}
	fields := []string{
		"path", "type=" + kind, "rdev=" + rdev,
		fmt.Sprintf("mode=%04o", st.Mode&07777),
		"uid=" + strconv.FormatUint(uint64(st.Uid), 10),
		"gid=" + strconv.FormatUint(uint64(st.Gid), 10),
		"name=" + escape(name),
	}
	if kind == "symlink" {
		if target, err := os.Readlink(name); err == nil {
			fields = append(fields, "target="+escape(target))
		}
	}
	out.line(fields...)
}

// major and minor decode a Linux dev_t (glibc's gnu_dev_major/minor).
func major(dev uint64) uint64 { return ((dev >> 8) & 0xfff) | ((dev >> 32) &^ 0xfff) }
func minor(dev uint64) uint64 { return (dev & 0xff) | ((dev >> 12) &^ 0xff) }

// reportMounts prints /proc/self/mountinfo as mount records. Its fields are
// already escaped with \ooo, so they pass through unchanged.
func reportMounts(out *lineWriter) int {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		out.line("mount", "error="+escape(err.Error()))
		return 0
	}
	count := 0
	for _, text := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		// id parent maj:min root point options [optional...] - fstype source super
		fields := strings.Fields(text)
		sep := -1
		for i, f := range fields {
			if f == "-" && i >= 6 {
				sep = i
				break
			}
		}
		if sep < 0 || len(fields) < sep+4 {
			out.line("mount", "unparsed="+escape(text))
			count++
			continue
		}
		out.line("mount",
			"id="+fields[0], "parent="+fields[1], "dev="+fields[2],
			"root="+fields[3], "point="+fields[4], "options="+fields[5],
			"fstype="+fields[sep+1], "source="+fields[sep+2], "super="+fields[sep+3])
		count++
	}
	return count
}
