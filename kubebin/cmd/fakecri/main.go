// Command fakecri serves the upstream fake CRI runtime (k8s.io/cri-client)
// on a unix socket so a real kubelet can run pods without containers.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/cri-client/pkg/fake"
)

func main() {
	endpoint := flag.String("endpoint", "", "unix:///path/to/socket to serve the CRI on")
	imageSize := flag.Uint64("image-size", 1<<20, "size reported for every image; the kubelet rejects images of size 0")
	flag.Parse()
	if *endpoint == "" {
		fmt.Fprintln(os.Stderr, "fakecri: --endpoint is required")
		os.Exit(2)
	}
	runtime := fake.NewFakeRemoteRuntime()
	runtime.ImageService.SetFakeImageSize(*imageSize)
	if err := runtime.Start(*endpoint); err != nil {
		fmt.Fprintln(os.Stderr, "fakecri:", err)
		os.Exit(1)
	}
	fmt.Fprintln(os.Stderr, "fakecri: serving on", *endpoint)

	// The fakes append every call to a slice; trim them so a long run does
	// not grow without bound.
	trim := time.NewTicker(30 * time.Second)
	defer trim.Stop()
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	for {
		select {
		case <-trim.C:
			runtime.RuntimeService.Lock()
			runtime.RuntimeService.Called = runtime.RuntimeService.Called[:0]
			runtime.RuntimeService.Unlock()
			runtime.ImageService.Lock()
			runtime.ImageService.Called = runtime.ImageService.Called[:0]
			runtime.ImageService.Unlock()
		case <-stop:
			runtime.Stop()
			return
		}
	}
}
