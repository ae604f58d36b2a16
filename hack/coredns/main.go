// A CoreDNS with only the plugins the real test node's cluster DNS uses (bind, errors, health,
// ready, kubernetes, cache): Services resolve for pods, nothing is forwarded off this machine,
// and the build is a fraction of CoreDNS with every plugin. Built by hack/build-tools.sh.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/ready"
)

// In CoreDNS's own order (core/dnsserver/zdirectives.go), the ones linked in.
var directives = []string{"bind", "ready", "health", "errors", "cache", "kubernetes"}

func init() {
	dnsserver.Directives = directives
}

func main() {
	coremain.Run()
}
