// Command servingcerts writes a throwaway CA and a serving certificate for localhost and
// 127.0.0.1 (tls.crt, tls.key, ca.crt) into a directory, for running the manager's hook
// servers on a developer machine (`make tilt-certs`, `make run`).
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/capi-inplace/capi-inplace/test/manager"
)

func main() {
	dir := flag.String("dir", ".tilt/certs", "directory to write tls.crt, tls.key and ca.crt into")
	flag.Parse()
	if _, err := manager.NewServingCerts(*dir); err != nil {
		fmt.Fprintf(os.Stderr, "servingcerts: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("wrote a serving certificate for localhost and its CA (ca.crt) into %s\n", *dir)
}
